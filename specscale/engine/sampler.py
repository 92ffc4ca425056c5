"""Greedy, temperature, top-k and top-p sampling; n independent draws per row, grouped by n.

A row with multiplicity n draws n tokens *independently* from its one distribution (never one draw
copied n times): that is what makes computation deduplication distribution-exact.

Draws use the exponential race: with E_i ~ Exp(1) independent, argmax_i p_i / E_i is distributed as
Categorical(p), because E_i / p_i ~ Exp(rate p_i) and the smallest of independent exponentials is
index i with probability p_i / sum_j p_j. Filtered-out tokens have p_i = 0 and never win. E is drawn as
-log(U), U ~ Uniform[0, 1): the same law as Tensor.exponential_, several times faster on CPU.

On CPU with the C++ kernels (`use_cpu_kernel`) the race runs in one pass per draw without materialising
U, in log space on the logits themselves: argmax_i p_i / E_i = argmax_i (l_i / T - log E_i), so there is no
softmax and no fp32 copy of bf16 logits, which at a 151,936-token vocabulary took ~15% of a decode step of
a 0.5B model at batch 32 (model/csrc/cpu_kernels.cpp: race_sample_logits; docs/bench/real-size.md, "Real-size
models"). U comes from a counter-based generator keyed once per row and call from the row's torch
generator, so seeded rows still reproduce whatever batch they are in.

Lanes (docs/design.md, "Seeds"): a seeded row of multiplicity m carries m generators, one per logical
copy; draw j comes from lane j alone, exactly as it would if that copy were its own row of multiplicity 1
(one key per lane on the kernel path, one U row per lane otherwise). Given equal logits, a deduplicated
row therefore draws the very tokens its copies would draw as separate rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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


@dataclass
class DrawGroup:
    """The race units that draw `draws` tokens each, raced in one call. A unit is `draws` tokens of one row
    from one generator (None: the engine's); a laned row gives one unit of one draw per lane."""

    draws: int
    outputs: list[int] = field(default_factory=list)  # per unit: its row in the caller's rows
    weight_rows: list[int] = field(default_factory=list)  # per unit: its row of the sampled weights
    generators: list[torch.Generator | None] = field(default_factory=list)


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
        out: list[list[int]] = [[] for _ in rows]
        greedy = [i for i, r in enumerate(rows) if r.temperature == 0]
        if greedy:
            best = logits[greedy].argmax(dim=-1).tolist()
            for i, token in zip(greedy, best, strict=True):
                out[i] = [token] * rows[i].num_draws
        sampled = [i for i, r in enumerate(rows) if r.temperature > 0]
        if sampled:
            sampled_logits = logits if len(sampled) == len(rows) else logits[sampled]  # [S, V]
            sampled_rows = [rows[i] for i in sampled]
            if self.use_cpu_kernel:
                weights, inverse_t = self._race_logits(sampled_logits, sampled_rows)
            else:
                weights, inverse_t = self._probabilities(sampled_logits.float(), sampled_rows), None  # [S, V]
            self._draw(weights, inverse_t, sampled, rows, out)
        return out

    def _race_logits(self, logits: torch.Tensor, rows: list[SampleRow]) -> tuple[torch.Tensor, torch.Tensor]:
        """What the C++ race takes: the logits as they are with 1 / T per row ([S, V], [S]), or, when a row
        filters (top-k / top-p), the filtered logits / T in fp32 with 1 / T = 1."""
        if not self._filters(rows):
            inverse_t = torch.tensor([1.0 / r.temperature for r in rows], dtype=torch.float32)
            return logits.contiguous(), inverse_t
        return self._scaled_logits(logits.float(), rows), torch.ones(len(rows), dtype=torch.float32)

    def _probabilities(self, logits: torch.Tensor, rows: list[SampleRow]) -> torch.Tensor:
        return self._scaled_logits(logits, rows).softmax(dim=-1)

    @staticmethod
    def _filters(rows: list[SampleRow]) -> bool:
        return any(r.top_k is not None or r.top_p < 1.0 for r in rows)

    def _scaled_logits(self, logits: torch.Tensor, rows: list[SampleRow]) -> torch.Tensor:
        """logits [S, V] fp32 -> logits / T with the tokens top-k / top-p drop at -inf."""
        temperature = torch.tensor([r.temperature for r in rows], dtype=logits.dtype, device=logits.device)
        logits = logits / temperature[:, None]
        if self._filters(rows):
            v = logits.shape[-1]
            top_k = torch.tensor([min(r.top_k or v, v) for r in rows], device=logits.device)
            top_p = torch.tensor([r.top_p for r in rows], dtype=logits.dtype, device=logits.device)
            logits = filter_top_k_top_p(logits, top_k, top_p)
        return logits

    def _draw(self, weights: torch.Tensor, inverse_t: torch.Tensor | None, indices: list[int], rows: list[SampleRow],
              out) -> None:
        """weights: probabilities [S, V] (torch race) or logits with 1 / T per row [S] (C++ race); row
        indices[k]'s at k. A laned row is one unit per lane (one draw each); any other row is one unit of all
        its draws. Units are raced in groups of equal draws, groups in the order their first unit comes."""
        for group in self._groups(indices, rows):
            whole = group.weight_rows == list(range(len(weights)))
            group_weights = weights if whole else weights[group.weight_rows]  # [G, V]
            if inverse_t is None:
                drawn = self._race(group_weights, group.generators, group.draws)
            else:
                group_inverse_t = inverse_t if whole else inverse_t[group.weight_rows]  # [G]
                drawn = cpu_kernels.race_sample_logits(group_weights.contiguous(), group_inverse_t,
                                                       self._keys(group.generators), group.draws).tolist()
            for i, tokens in zip(group.outputs, drawn, strict=True):
                out[i] += tokens  # lanes in order: draw j of a laned row is lane j's

    @staticmethod
    def _groups(indices: list[int], rows: list[SampleRow]) -> list[DrawGroup]:
        """The race units of the sampled rows (row indices[k]'s weights at k), grouped by their draws."""
        groups: dict[int, DrawGroup] = {}
        for k, i in enumerate(indices):
            row = rows[i]
            draws = 1 if row.lanes else row.num_draws
            group = groups.get(draws)
            if group is None:
                group = groups[draws] = DrawGroup(draws)
            if row.lanes:
                group.outputs += [i] * len(row.lanes)
                group.weight_rows += [k] * len(row.lanes)
                group.generators += row.lanes
            else:
                group.outputs.append(i)
                group.weight_rows.append(k)
                group.generators.append(None)
        return list(groups.values())

    def _race(self, probs: torch.Tensor, generators: list[torch.Generator | None], n: int) -> list[list[int]]:
        """probs [G, V] -> n draws per unit (one generator each), [G][n] token ids (plain torch)."""
        uniform = self._uniforms(generators, n, probs.shape[-1], probs.device)  # [G, n, V]
        noise = uniform.log_().neg_()  # E = -log(U) ~ Exp(1); U = 0 gives inf: that draw ignores the token
        return (probs[:, None, :] / noise).argmax(dim=-1).tolist()  # [G, n]

    def _keys(self, generators: list[torch.Generator | None]) -> torch.Tensor:
        """One key per unit for the C++ race: a seeded unit's from its own generator, the others' from the
        engine's generator in one call."""
        shared = iter(torch.randint(KEY_RANGE, (len(generators),), generator=self.generator).tolist())
        keys = [next(shared) if g is None else int(torch.randint(KEY_RANGE, (1,), generator=g)) for g in generators]
        return torch.tensor(keys)

    def _uniforms(self, generators: list[torch.Generator | None], n: int, vocab: int, device) -> torch.Tensor:
        """U ~ Uniform[0, 1) of shape [G, n, V]: a seeded unit's from its own generator (so its draws do not
        depend on the batch it is in), the other units' from the engine's generator in one call."""
        shared = [j for j, g in enumerate(generators) if g is None]
        if not shared:  # every unit seeded (a search's rows): one [n, V] draw per generator, stacked
            if device.type == "cpu":  # at a small vocabulary the device keyword costs more than the draw
                return torch.stack([torch.rand(n, vocab, generator=g) for g in generators])
            return torch.stack([torch.rand((n, vocab), generator=g, device=device) for g in generators])
        if len(shared) == len(generators):
            return torch.rand((len(generators), n, vocab), generator=self.generator, device=device)
        uniform = torch.empty((len(generators), n, vocab), device=device)  # [G, n, V]
        for j, g in enumerate(generators):
            if g is not None:
                torch.rand((n, vocab), generator=g, device=device, out=uniform[j])
        uniform[shared] = torch.rand((len(shared), n, vocab), generator=self.generator, device=device)
        return uniform
