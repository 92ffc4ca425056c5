"""A plain, synchronous PRM-guided beam search with ``transformers``, recording every round.

This is the measuring stick of the toy workload, not the serving engine: each round samples one step
for every live candidate (T = 0.8), waits for all of them, scores them with the PRM (``last`` step
score), sends completed paths to the finished pool and keeps the top ``k = N / M`` of the others, each
expanded into ``M`` children (round 0 expands the prompt into ``N``). It stops when ``N`` paths have
completed, nothing is live, or after ``max_rounds``.

``beam_search(models, problems, settings) -> list[SearchResult]``; each result holds the chosen answer
and the rounds' ``RoundRecord``: step lengths (tokens) of the round's candidates and their sibling
groups' token sequences, from which ``toy_stats`` computes waiting-time and common-prefix ratios.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specscale.verify.hf_prm import score_batch
from specscale_lab.tasks.hf_sampling import SamplingSettings, sample_continuations
from specscale_lab.tasks.toy import ToyProblem, split_steps
from specscale_lab.tasks.toy_models import ToyModels


@dataclass(frozen=True)
class BeamSettings:
    """Beam size N, beam width M and caps (tokens per step, per path, rounds)."""

    n: int = 8
    m: int = 4
    max_rounds: int = 40
    max_step_tokens: int = 160
    max_path_tokens: int = 1024
    sampling: SamplingSettings = field(default_factory=SamplingSettings)


@dataclass
class Path:
    """A candidate: its generated token ids, ``last`` PRM score, and whether it has completed."""

    ids: list[int]
    score: float = 0.0
    done: bool = False


@dataclass(frozen=True)
class RoundRecord:
    """One round of one search: every candidate's new step (token ids), grouped by parent."""

    groups: list[list[list[int]]]

    @property
    def lengths(self) -> list[int]:
        return [len(step) for group in self.groups for step in group]


@dataclass
class SearchResult:
    """The finished paths, the answer (text of the best-scored one) and the rounds of one search."""

    problem: ToyProblem
    answer_text: str = ""
    rounds: list[RoundRecord] = field(default_factory=list)
    finished: list[Path] = field(default_factory=list)


def beam_search(models: ToyModels, problems: list[ToyProblem], settings: BeamSettings) -> list[SearchResult]:
    """Run one beam search per problem, all problems batched round by round."""
    results = [SearchResult(problem) for problem in problems]
    prompts = [models.prompt(p.question) for p in problems]
    live: list[list[Path]] = [[Path([])] for _ in problems]
    for round_index in range(settings.max_rounds):
        active = [i for i, paths in enumerate(live) if paths]
        if not active:
            break
        children = _expand(models, prompts, live, active, settings, round_index)
        _score(models, problems, children)
        for i in active:
            results[i].rounds.append(RoundRecord([[c.ids[len(p.ids):] for c in kids] for p, kids in children[i]]))
            live[i] = _select(results[i], [c for _, kids in children[i] for c in kids], settings)
    for result, paths in zip(results, live, strict=True):
        pool = result.finished or paths
        best = max(pool, key=lambda path: path.score) if pool else Path([])
        result.answer_text = models.text(best.ids)
    return results


def _expand(models, prompts, live, active, settings: BeamSettings, round_index: int):
    """Sample one step for each child of every live path: ``{problem: [(parent, children)]}``."""
    width = settings.n if round_index == 0 else settings.m
    parents = [(i, path) for i in active for path in live[i]]
    stop_ids = models.stop_ids()
    sampling = SamplingSettings(
        temperature=settings.sampling.temperature,
        max_new_tokens=settings.max_step_tokens,
        batch_rows=settings.sampling.batch_rows,
        seed=settings.sampling.seed * 1000 + round_index,
    )
    prefixes = [prompts[i] + path.ids for i, path in parents]
    steps = sample_continuations(
        models.generator, prefixes, width, stop_ids, models.gen_tokenizer.pad_token_id, sampling
    )
    children: dict[int, list[tuple[Path, list[Path]]]] = {i: [] for i in active}
    for (i, parent), group in zip(parents, steps, strict=True):
        kids = []
        for step in group:
            ids = parent.ids + step
            ended = not step or step[-1] != stop_ids[0] or len(ids) >= settings.max_path_tokens
            kids.append(Path(ids, done=ended))
        children[i].append((parent, kids))
    return children


def _score(models: ToyModels, problems: list[ToyProblem], children) -> None:
    """Score every child with the PRM; a path's score is its last step's score."""
    paths = [(i, kid) for i, groups in children.items() for _, kids in groups for kid in kids]
    queries = [(problems[i].question, split_steps(models.text(kid.ids)) or [""]) for i, kid in paths]
    for (_, kid), scores in zip(paths, score_batch(models.prm, models.prm_tokenizer, queries), strict=True):
        kid.score = scores[-1]


def _select(result: SearchResult, children: list[Path], settings: BeamSettings) -> list[Path]:
    """Move completed children to the finished pool; keep the top k of the rest as next parents."""
    result.finished += [path for path in children if path.done]
    if len(result.finished) >= settings.n:
        return []
    open_paths = sorted((p for p in children if not p.done), key=lambda p: p.score, reverse=True)
    return open_paths[: settings.n // settings.m]
