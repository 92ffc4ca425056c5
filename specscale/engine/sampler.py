"""Greedy, temperature, top-k and top-p sampling; n independent draws per row, grouped by n.

A row with multiplicity n draws n tokens *independently* from its one distribution (never one draw
copied n times): that is what makes computation deduplication distribution-exact.

Draws use the exponential race: with E_i ~ Exp(1) independent, argmax_i p_i / E_i is distributed as
Categorical(p), because E_i / p_i ~ Exp(rate p_i) and the smallest of independent exponentials is
index i with probability p_i / sum_j p_j. Filtered-out tokens have p_i = 0 and never win. E is drawn as
-log(U), U ~ Uniform[0, 1): the same law as Tensor.exponential_, several times faster on CPU.

On CPU with the C++ kernels (`use_cpu_kernel`) the race runs in one pass per draw without materialising
U (model/csrc/cpu_kernels.cpp: race_sample): U comes from a counter-based generator keyed once per row
and call from the row's torch generator, so seeded rows still reproduce whatever batch they are in.

Lanes (docs/design.md, "Seeds"): a seeded row of multiplicity m carries m generators, one per logical
copy; draw j comes from lane j alone, exactly as it would if that copy were its own row of multiplicity 1
(one key per lane on the kernel path, one U row per lane otherwise). Given equal logits, a deduplicated
row therefore draws the very tokens its copies would draw as separate rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specscale.model import cpu_kernels


@dataclass(frozen=True)
class SampleRow:
    temperature: float
    top_p: float
    top_k: int | None
    num_draws: int
    lanes: tuple[torch.Generator, ...] = ()  # one generator per draw (a seeded sequence); () -> the engine's

    def __post_init__(self) -> None:
        if self.lanes and len(self.lanes) != self.num_draws:
            raise ValueError(f"a row of {self.num_draws} draws needs {self.num_draws} lanes, got {len(self.lanes)}")


@dataclass(frozen=True)
class DrawUnit:
    """What one race call draws for: `draws` tokens of one row, from one generator (None: the engine's)."""

    row: int  # index into the sampled rows' probabilities
    draws: int
    generator: torch.Generator | None


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


KEY_RANGE = 2**62  # keys of the C++ race's counter-based generator are drawn from [0, KEY_RANGE)


class Sampler:
    def __init__(self, generator: torch.Generator, use_cpu_kernel: bool = False):
        self.generator = generator
        self.use_cpu_kernel = use_cpu_kernel

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
            sampled_logits = logits if len(sampled) == len(rows) else logits[sampled]  # [S, V]
            probs = self._probabilities(sampled_logits, [rows[i] for i in sampled])  # [S, V]
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
        """probs [S, V]: row indices[k]'s distribution at k. A laned row is one unit per lane (one draw
        each); any other row is one unit of all its draws. Units are raced in groups of equal draws."""
        units: list[tuple[int, DrawUnit]] = []  # (the row in `rows`, its unit)
        for k, i in enumerate(indices):
            row = rows[i]
            if row.lanes:
                units += [(i, DrawUnit(k, 1, lane)) for lane in row.lanes]
            else:
                units.append((i, DrawUnit(k, row.num_draws, None)))
        by_draws: dict[int, list[tuple[int, DrawUnit]]] = {}
        for item in units:
            by_draws.setdefault(item[1].draws, []).append(item)
        for n, group in by_draws.items():
            rows_of_group = [unit.row for _, unit in group]
            group_probs = probs if rows_of_group == list(range(len(probs))) else probs[rows_of_group]  # [G, V]
            for (i, _), drawn in zip(group, self._race(group_probs, [unit for _, unit in group], n)):
                out[i] += drawn  # lanes in order: draw j of a laned row is lane j's

    def _race(self, probs: torch.Tensor, units: list[DrawUnit], n: int) -> list[list[int]]:
        """probs [G, V] -> n draws per unit, [G][n] token ids."""
        if self.use_cpu_kernel:
            return cpu_kernels.race_sample(probs.contiguous(), self._keys(units), n).tolist()
        uniform = self._uniforms(units, n, probs.shape[-1], probs.device)  # [G, n, V]
        noise = uniform.log_().neg_()  # E = -log(U) ~ Exp(1); U = 0 gives inf: that draw ignores the token
        return (probs[:, None, :] / noise).argmax(dim=-1).tolist()  # [G, n]

    def _keys(self, units: list[DrawUnit]) -> torch.Tensor:
        """One key per unit for the C++ race: a seeded unit's from its own generator, the others' from the
        engine's generator in one call."""
        shared = iter(torch.randint(KEY_RANGE, (len(units),), generator=self.generator).tolist())
        keys = [next(shared) if u.generator is None else int(torch.randint(KEY_RANGE, (1,), generator=u.generator))
                for u in units]
        return torch.tensor(keys)

    def _uniforms(self, units: list[DrawUnit], n: int, vocab: int, device) -> torch.Tensor:
        """U ~ Uniform[0, 1) of shape [G, n, V]: a seeded unit's from its own generator (so its draws do not
        depend on the batch it is in), the other units' from the engine's generator in one call."""
        uniform = torch.empty((len(units), n, vocab), device=device)  # [G, n, V]
        shared = [j for j, u in enumerate(units) if u.generator is None]
        for j, u in enumerate(units):
            if u.generator is not None:
                torch.rand((n, vocab), generator=u.generator, device=device, out=uniform[j])
        if len(shared) == len(units):
            return torch.rand((len(units), n, vocab), generator=self.generator, device=device, out=uniform)
        if shared:
            uniform[shared] = torch.rand((len(shared), n, vocab), generator=self.generator, device=device)
        return uniform
