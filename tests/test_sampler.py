"""Sampling follows the row's distribution (chi-square), multi-draw rows are independent, seeds reproduce."""

import pytest
import torch
from scipy.stats import chisquare

from specscale.engine.sampler import Sampler, SampleRow, filter_top_k_top_p
from specscale.model import cpu_kernels

LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])


@pytest.fixture(params=["torch", "cpp"])
def use_kernel(request) -> bool:
    """Every sampler test runs on both races: plain torch and the C++ one-pass kernel (CPU)."""
    if request.param == "cpp":
        assert cpu_kernels.available(), "the C++ kernels failed to build"
    return request.param == "cpp"


def expected_probs(temperature=1.0, top_k=None, top_p=1.0):
    """Reference: keep the top_k most likely, renormalise, keep the smallest head with mass >= top_p."""
    probs = (LOGITS / temperature).softmax(-1)
    order = probs.argsort(descending=True).tolist()
    kept = order[: top_k or len(order)]
    total = sum(probs[i].item() for i in kept)
    nucleus, mass = [], 0.0
    for i in kept:
        if mass >= top_p:
            break
        nucleus.append(i)
        mass += probs[i].item() / total
    out = torch.zeros_like(probs)
    out[nucleus] = probs[nucleus]
    return out / out.sum()


def draw_counts(row: SampleRow, rows_in_batch: int, trials: int, use_kernel: bool) -> torch.Tensor:
    sampler = Sampler(torch.Generator().manual_seed(0), use_kernel)
    counts = torch.zeros(len(LOGITS))
    logits = LOGITS.repeat(rows_in_batch, 1)
    for _ in range(trials):
        for tokens in sampler(logits, [row] * rows_in_batch):
            for t in tokens:
                counts[t] += 1
    return counts


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, None, 1.0), (0.8, None, 1.0), (1.0, 3, 1.0),
                                                     (1.0, None, 0.7), (1.3, 4, 0.9)])
def test_draws_fit_the_distribution(temperature, top_k, top_p, use_kernel):
    counts = draw_counts(SampleRow(temperature, top_p, top_k, 4), rows_in_batch=50, trials=40,
                         use_kernel=use_kernel)
    probs = expected_probs(temperature, top_k, top_p)
    support = probs > 0
    assert counts[~support].sum() == 0, "a filtered-out token was drawn"
    result = chisquare(counts[support].numpy(), (probs[support] * counts.sum()).numpy())
    assert result.pvalue > 1e-3, f"chi-square p={result.pvalue}"


def test_filter_keeps_exactly_the_nucleus():
    filtered = filter_top_k_top_p(LOGITS[None], torch.tensor([6]), torch.tensor([0.7]))
    kept = torch.isfinite(filtered[0])
    assert kept.tolist() == [True, True, False, False, False, False]  # 0.59 < 0.7 <= 0.59 + 0.22


def test_multi_draw_is_not_one_draw_copied(use_kernel):
    # Across many rows of 4 draws from a near-uniform row, copies would make every row constant.
    sampler = Sampler(torch.Generator().manual_seed(1), use_kernel)
    rows = [SampleRow(1.0, 1.0, None, 4)] * 200
    draws = sampler(torch.zeros(200, 6), rows)
    constant = sum(len(set(d)) == 1 for d in draws)
    assert constant < 10  # independent draws: P(all 4 equal) = 6 / 6^4 < 0.5%


def test_rows_with_different_draw_counts_in_one_batch(use_kernel):
    sampler = Sampler(torch.Generator().manual_seed(2), use_kernel)
    rows = [SampleRow(1.0, 1.0, None, n, None) for n in (1, 3, 8, 3, 0 + 1)] + [SampleRow(0.0, 1.0, None, 5)]
    draws = sampler(LOGITS.repeat(6, 1), rows)
    assert [len(d) for d in draws] == [1, 3, 8, 3, 1, 5]
    assert draws[-1] == [0] * 5  # greedy: the argmax, n times


def test_seeded_rows_reproduce_and_ignore_the_batch(use_kernel):
    def run(extra_rows):
        lanes = tuple(torch.Generator().manual_seed(1234 + j) for j in range(3))
        rows = [SampleRow(1.0, 1.0, None, 3, lanes)] + [SampleRow(1.0, 1.0, None, 2)] * extra_rows
        sampler = Sampler(torch.Generator().manual_seed(extra_rows), use_kernel)
        return [sampler(LOGITS.repeat(1 + extra_rows, 1), rows)[0] for _ in range(20)]

    assert run(0) == run(0)
    assert run(0) == run(7)  # the seeded row's draws do not depend on what else is in the batch


def test_a_laned_row_draws_what_its_lanes_draw_as_separate_rows(use_kernel):
    """CD pairing (docs/design.md, "Seeds"): draw j of a row of multiplicity 3 comes from lane j alone, so
    it equals the draw of a multiplicity-1 row seeded like lane j, whatever else is in the batch."""
    seeds = (11, 22, 33)

    def laned():
        lanes = tuple(torch.Generator().manual_seed(s) for s in seeds)
        sampler = Sampler(torch.Generator().manual_seed(5), use_kernel)
        row = SampleRow(1.0, 1.0, None, 3, lanes)
        return [sampler(LOGITS.repeat(2, 1), [row, SampleRow(1.0, 1.0, None, 3)])[0] for _ in range(30)]

    def separate():
        lanes = [torch.Generator().manual_seed(s) for s in seeds]
        sampler = Sampler(torch.Generator().manual_seed(6), use_kernel)
        rows = [SampleRow(1.0, 1.0, None, 1, (lane,)) for lane in lanes]
        return [[d[0] for d in sampler(LOGITS.repeat(3, 1), rows)] for _ in range(30)]

    draws = laned()
    assert draws == separate()
    assert any(len(set(d)) > 1 for d in draws)  # the lanes really draw different tokens


def test_wide_rows_fit_the_distribution(use_kernel):
    """40 tokens (the kernel's 16-lane loop and its scalar tail), a third of them filtered out by top-k."""
    logits = torch.randn(40, generator=torch.Generator().manual_seed(3)) * 1.5
    row = SampleRow(1.0, 1.0, 27, 8)
    sampler = Sampler(torch.Generator().manual_seed(4), use_kernel)
    counts = torch.zeros(40)
    for _ in range(25):
        for tokens in sampler(logits.repeat(40, 1), [row] * 40):
            counts += torch.bincount(torch.tensor(tokens), minlength=40)
    probs = filter_top_k_top_p(logits[None], torch.tensor([27]), torch.tensor([1.0]))[0].softmax(-1)
    support = probs > 0
    assert counts[~support].sum() == 0, "a filtered-out token was drawn"
    result = chisquare(counts[support].numpy(), (probs[support] * counts.sum()).numpy())
    assert result.pvalue > 1e-3, f"chi-square p={result.pvalue}"
