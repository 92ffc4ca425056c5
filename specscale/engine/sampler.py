"""Greedy, temperature, top-k and top-p sampling; n independent draws per row, grouped by n.

A row with multiplicity n draws n tokens *independently* from its one distribution (never one draw
copied n times): that is what makes computation deduplication distribution-exact.

Draws use the exponential race: with E_i ~ Exp(1) independent, argmax_i p_i / E_i is distributed as
Categorical(p), because E_i / p_i ~ Exp(rate p_i) and the smallest of independent exponentials is
index i with probability p_i / sum_j p_j. Filtered-out tokens have p_i = 0 and never win. E is drawn as
-log(U), U ~ Uniform[0, 1): the same law as Tensor.exponential_, several times faster on CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SampleRow:
    temperature: float
    top_p: float
    top_k: int | None
    num_draws: int
    generator: torch.Generator | None  # a seeded sequence's own generator; None -> the engine's


def filter_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """logits [R, V] (already temperature-scaled); top_k [R] (V = off), top_p [R] (1.0 = off).

    Keeps the k largest, then the smallest set of the largest whose probabilities sum to >= top_p.
    """
    sorted_logits, order = logits.sort(dim=-1, descending=True)  # [R, V]
    v = logits.shape[-1]
    ranks = torch.arange(v, device=logits.device)[None, :]
    drop = ranks >= top_k[:, None]
    probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs  # probability of the strictly larger tokens
    drop |= mass_before >= top_p[:, None]
    filtered = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, filtered)


class Sampler:
    def __init__(self, generator: torch.Generator):
        self.generator = generator

    def __call__(self, logits: torch.Tensor, rows: list[SampleRow]) -> list[list[int]]:
        """logits [R, V] -> for each row its num_draws token ids."""
        logits = logits.float()
        out: list[list[int]] = [[] for _ in rows]
        greedy = [i for i, r in enumerate(rows) if r.temperature == 0]
        if greedy:
            best = logits[greedy].argmax(dim=-1).tolist()
            for i, token in zip(greedy, best):
                out[i] = [token] * rows[i].num_draws
        sampled = [i for i, r in enumerate(rows) if r.temperature > 0]
        if sampled:
            probs = self._probabilities(logits[sampled], [rows[i] for i in sampled])  # [S, V]
            self._draw(probs, sampled, rows, out)
        return out

    def _probabilities(self, logits: torch.Tensor, rows: list[SampleRow]) -> torch.Tensor:
        temperature = torch.tensor([r.temperature for r in rows], dtype=logits.dtype, device=logits.device)
        logits = logits / temperature[:, None]
        if any(r.top_k is not None or r.top_p < 1.0 for r in rows):
            v = logits.shape[-1]
            top_k = torch.tensor([min(r.top_k or v, v) for r in rows], device=logits.device)
            top_p = torch.tensor([r.top_p for r in rows], dtype=logits.dtype, device=logits.device)
            logits = filter_top_k_top_p(logits, top_k, top_p)
        return logits.softmax(dim=-1)

    def _draw(self, probs: torch.Tensor, indices: list[int], rows: list[SampleRow], out) -> None:
        by_draws: dict[int, list[int]] = {}  # rows grouped by their number of draws n
        for k, i in enumerate(indices):
            by_draws.setdefault(rows[i].num_draws, []).append(k)
        for n, group in by_draws.items():
            uniform = self._uniforms([rows[indices[k]] for k in group], n, probs.shape[-1], probs.device)  # [G, n, V]
            noise = uniform.log_().neg_()  # E = -log(U) ~ Exp(1); U = 0 gives inf: that draw ignores the token
            tokens = (probs[group][:, None, :] / noise).argmax(dim=-1).tolist()  # [G, n]
            for k, drawn in zip(group, tokens):
                out[indices[k]] = drawn

    def _uniforms(self, rows: list[SampleRow], n: int, vocab: int, device) -> torch.Tensor:
        """U ~ Uniform[0, 1) of shape [G, n, V]: a seeded row's from its own generator (so its draws do not
        depend on the batch it is in), the other rows' from the engine's generator in one call."""
        uniform = torch.empty((len(rows), n, vocab), device=device)
        shared = [j for j, row in enumerate(rows) if row.generator is None]
        for j, row in enumerate(rows):
            if row.generator is not None:
                torch.rand((n, vocab), generator=row.generator, device=device, out=uniform[j])
        if len(shared) == len(rows):
            return torch.rand((len(rows), n, vocab), generator=self.generator, device=device, out=uniform)
        if shared:
            uniform[shared] = torch.rand((len(shared), n, vocab), generator=self.generator, device=device)
        return uniform
