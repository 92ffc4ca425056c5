"""The C++ race (model/csrc/cpu_kernels.cpp: race_sample_logits) draws exactly the tokens of the full race,
which computes both logarithms of every draw: its pruning (first_contender) only skips draws that cannot
win, so seeded runs reproduce across versions. Expected tokens were recorded from the full race."""

import pytest
import torch

from specscale.model import cpu_kernels

pytestmark = pytest.mark.skipif(not cpu_kernels.available(), reason="no C++ compiler: the torch path is used")

VOCABULARY = 151_936  # Qwen2.5's: 9,496 vectors of 16 draws, no tail
# (vocabulary, dtype, kind of logits, temperature)
CASES = [(VOCABULARY, "bfloat16", "random", 0.8), (VOCABULARY, "bfloat16", "peaked", 0.8),
         (VOCABULARY, "float32", "peaked", 0.3), (VOCABULARY, "float32", "filtered", 1.0),
         (4_105, "bfloat16", "random", 2.0), (4_105, "float32", "integer ties", 0.8), (40, "float32", "random", 0.8)]


def race_inputs(vocabulary: int, dtype: str, kind: str, temperature: float):
    """4 rows of logits [4, V] of one kind, 1 / T per row [4], one key per row [4]."""
    generator = torch.Generator().manual_seed(vocabulary + len(kind))
    logits = torch.randn(4, vocabulary, generator=generator) * 3
    if kind == "peaked":  # a few tokens far ahead, as a trained model's logits are
        logits[:, torch.randint(0, vocabulary, (5,), generator=generator)] += 12
    if kind == "filtered":  # top-k / top-p leave most tokens at -inf; row 0 has none left
        logits[torch.rand(4, vocabulary, generator=generator) < 0.95] = float("-inf")
        logits[0] = float("-inf")
    if kind == "integer ties":
        logits = logits.round()
    keys = torch.randint(0, 2**62, (4,), generator=generator)
    return logits.to(getattr(torch, dtype)), torch.full((4,), 1 / temperature), keys


EXPECTED = {  # recorded from the full race (every draw's two logarithms computed)
    (151936, 'bfloat16', 'random', 0.8): [[138316, 148573], [74538, 37023], [55703, 74725], [39895, 117767]],
    (151936, 'bfloat16', 'peaked', 0.8): [[122652, 149277], [99332, 99332], [146483, 146483], [15516, 99332]],
    (151936, 'float32', 'peaked', 0.3): [[145587, 145587], [99332, 99332], [146483, 146483], [22298, 99332]],
    (151936, 'float32', 'filtered', 1.0): [[0, 0], [96893, 104546], [42199, 5453], [85588, 33699]],
    (4105, 'bfloat16', 'random', 2.0): [[913, 1445], [3515, 2324], [3160, 1029], [982, 2208]],
    (4105, 'float32', 'integer ties', 0.8): [[1025, 1025], [982, 706], [1849, 2869], [577, 2512]],
    (40, 'float32', 'random', 0.8): [[4, 9], [29, 29], [1, 35], [23, 16]],
}


@pytest.mark.parametrize("case", CASES)
def test_race_draws_the_tokens_of_the_full_race(case):
    logits, inverse_t, keys = race_inputs(*case)
    assert cpu_kernels.race_sample_logits(logits, inverse_t, keys, 2).tolist() == EXPECTED[case]
