"""CD is distribution-exact: one sequence of multiplicity m yields step texts distributed like m
independent samples. Two-token steps from a tiny random model, top-k 3 (9 possible steps, whose exact
probabilities come from transformers); the multiset of the m steps of each trial must follow the
multinomial law. A bug that draws once and copies m times puts all mass on "m equal steps" and fails.
"""

import itertools
import math
from collections import Counter

import torch
from scipy.stats import chisquare
from transformers import AutoModelForCausalLM

from engine_helpers import make_engine
from specscale.engine.sequence import SequenceStatus
from specscale.seam import SamplingParams

PROMPT = [5, 17, 42, 99, 120, 7]
M, TRIALS, TOP_K, TEMPERATURE = 4, 1500, 3, 1.0


def step_distribution(path) -> dict[tuple[int, int], float]:
    """Exact P(two-token step) under temperature 1 and top-k 3 at each position."""
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()

    def top_k_probs(tokens):
        with torch.no_grad():
            logits = model(torch.tensor([tokens])).logits[0, -1]
        values, ids = logits.topk(TOP_K)
        return dict(zip(ids.tolist(), values.softmax(-1).tolist(), strict=True))

    first = top_k_probs(PROMPT)
    return {(a, b): pa * pb for a, pa in first.items() for b, pb in top_k_probs(PROMPT + [a]).items()}


def multiset_probabilities(step_probs: dict) -> dict[tuple, float]:
    """Multinomial law of the sorted m-tuple of independent steps."""
    out = {}
    for combo in itertools.combinations_with_replacement(sorted(step_probs), M):
        counts = Counter(combo)
        ways = math.factorial(M) / math.prod(math.factorial(c) for c in counts.values())
        out[combo] = ways * math.prod(step_probs[s] ** c for s, c in counts.items())
    return out


def cd_trials(path) -> list[tuple]:
    engine = make_engine(path, num_kv_blocks=4096, max_num_seqs=512, max_num_batched_tokens=8192)
    params = SamplingParams(temperature=TEMPERATURE, top_k=TOP_K, max_new_tokens=2, ignore_eos=True)
    roots = [engine.add(PROMPT, params, multiplicity=M) for _ in range(TRIALS)]
    tokens: dict[int, list[int]] = {}
    family: dict[int, int] = {r: r for r in roots}
    copies: dict[int, int] = {r: M for r in roots}
    while engine.has_work():
        for out in engine.step():
            if out.parent_id is not None:  # split: the child inherits its parent's tokens so far
                family[out.seq_id] = family[out.parent_id]
                tokens[out.seq_id] = tokens.get(out.parent_id, [None])[:-1]  # parent's output came first
            tokens.setdefault(out.seq_id, []).extend(out.new_token_ids)
            copies[out.seq_id] = out.multiplicity
            assert out.status in (SequenceStatus.RUNNING, SequenceStatus.FINISHED)
    assert engine.block_manager.num_used_blocks == 0
    trials: dict[int, list] = {r: [] for r in roots}
    for seq_id, toks in tokens.items():
        trials[family[seq_id]] += [tuple(toks)] * copies[seq_id]
    return [tuple(sorted(t)) for t in trials.values()]


def test_multiplicity_sampling_matches_independent_samples(qwen2_dir):
    expected = multiset_probabilities(step_distribution(qwen2_dir))
    observed = Counter(cd_trials(qwen2_dir))
    assert sum(len(t) * n for t, n in observed.items()) == M * TRIALS and set(observed) <= set(expected)
    # pool the rare multisets so every cell expects >= 5
    cells, pooled_obs, pooled_exp = [], 0, 0.0
    for combo, p in sorted(expected.items(), key=lambda kv: -kv[1]):
        if p * TRIALS >= 5:
            cells.append((observed[combo], p * TRIALS))
        else:
            pooled_obs, pooled_exp = pooled_obs + observed[combo], pooled_exp + p * TRIALS
    cells.append((pooled_obs, pooled_exp))
    obs, exp = zip(*cells, strict=True)
    exp = [e * sum(obs) / sum(exp) for e in exp]
    assert chisquare(obs, exp).pvalue > 1e-3
    all_equal = sum(n for combo, n in observed.items() if len(set(combo)) == 1) / TRIALS
    assert all_equal < 0.9  # a copied draw would make every trial "all equal"
