"""Fitting workload parameters to published facts (or to what a trace measured).

- `waiting_ratio` / `waiting_sigma`: beam search at batch size 1 waits for a round's slowest sibling; with
  N i.i.d. step lengths L the share of candidate time spent waiting is 1 - E[sum L] / (N E[max L]) (decode
  iterations cost about the same at small batch on an accelerator). The spread of the step-length
  lognormal sets it.
- `sibling_common_prefix` / `top_token_prob`: M siblings sampled from one prefix with the simulated
  generator itself share a token trie; 1 - trie nodes / tokens is the common-prefix ratio the
  characterization measures. The dominant token's probability sets it.
Both estimates are Monte Carlo with a fixed seed, so the bisections see a deterministic, monotone function.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from specscale.engine.sequence import Sequence
from specscale.sim.problems import make_problems
from specscale.sim.synthetic_generator import SyntheticGenerator
from specscale.sim.tokenizer import SyntheticTokenizer
from specscale.sim.workload import REFERENCE_TEMPERATURE, WorkloadParams, discrete_lognormal


def waiting_ratio(step_tokens_median: float, sigma: float, beam_size: int, max_step_tokens: int = 1024,
                  rounds: int = 20_000, seed: int = 0) -> float:
    pmf = discrete_lognormal(step_tokens_median, sigma, 2, max_step_tokens)
    lengths = np.random.default_rng(seed).choice(np.arange(2, max_step_tokens + 1), p=pmf, size=(rounds, beam_size))
    return 1.0 - lengths.sum() / (beam_size * lengths.max(axis=1).sum())


def waiting_sigma(step_tokens_median: float, target: float, beam_size: int = 8, max_step_tokens: int = 1024) -> float:
    """The step-length sigma at which beam search of beam_size waits `target` of its candidate time."""
    return bisect(lambda s: waiting_ratio(step_tokens_median, s, beam_size, max_step_tokens), target, 0.01, 2.0)


def sibling_common_prefix(params: WorkloadParams, width: int = 4, groups: int = 200, seed: int = 0) -> float:
    """Common-prefix token ratio of `groups` sibling groups of `width` first steps, sampled (at the reference
    temperature) from the simulated generator; siblings that drew the same tokens share one trie node, and
    each node draws its siblings' next tokens from its one distribution."""
    tokenizer = SyntheticTokenizer(levels=params.levels)
    generator = SyntheticGenerator(params, tokenizer, seed)
    rng = np.random.default_rng(seed)
    ids = iter(range(1 << 62))
    saved = total = 0
    for problem in make_problems(params, tokenizer, groups, seed):
        nodes, group_tokens = [(list(problem.prompt_ids), width)], 0
        while nodes:
            logits = generator.outputs([(Sequence(next(ids), tokens, None, 0), len(tokens) - 1) for tokens, _ in nodes])
            probs = np.exp(logits.numpy().astype(np.float64) / REFERENCE_TEMPERATURE)  # [nodes, generated_size]
            children = []
            for (tokens, count), p in zip(nodes, probs, strict=True):
                drawn = rng.multinomial(count, p / p.sum())
                for token in np.flatnonzero(drawn):
                    group_tokens += int(drawn[token])
                    saved += int(drawn[token]) - 1
                    if token not in (tokenizer.delimiter, tokenizer.eos):
                        children.append((tokens + [int(token)], int(drawn[token])))
            nodes = children
        total += group_tokens
    return saved / total


def top_token_prob(params: WorkloadParams, target: float, width: int = 4, groups: int = 200) -> float:
    """The dominant-token probability at which siblings share `target` of their tokens."""
    ratio = lambda q: sibling_common_prefix(replace(params, top_token_prob=q), width, groups)  # noqa: E731
    return bisect(ratio, target, 0.5, 0.9995)


def bisect(f, target: float, low: float, high: float, iterations: int = 18) -> float:
    """x in [low, high] with f(x) = target, f monotone (either direction)."""
    rising = f(high) > f(low)
    for _ in range(iterations):
        mid = (low + high) / 2
        if (f(mid) < target) == rising:
            low = mid
        else:
            high = mid
    return (low + high) / 2
