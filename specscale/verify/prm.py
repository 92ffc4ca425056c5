"""The PRM verifier: scores the steps of many paths of many requests in one prefill-only engine batch.

`Verifier.score(requests)` takes (question, steps so far) pairs and returns, per path, one score in
[0, 1] per non-empty step. It owns a PRM `Engine`; each path becomes a readout sequence whose readouts
are the head outputs at the path's score positions (see `specscale.verify.formats`).

Prefix reuse (the step-boundary cache). After a path is scored its engine sequence is kept PAUSED, KV
and all, in `StepPrefixCache`, keyed by a chain hash of its per-step token pieces and holding the step
scores it already has. A later path looks up the longest cached boundary that is a prefix of its own
input, forks that sequence (blocks shared, copy-on-write) and extends it with the remaining tokens only,
reading out only the new steps. So scoring step k of a path whose steps 1..k-1 were scored computes just
step k's tokens plus its separator / template tail, and sibling paths that forked in the search all
share their parent's cached prefix. Fresh paths still get the engine's automatic prefix caching of
full blocks (the engine never skips a block holding a readout position); so that the fresh paths of one
question in one batch (a search's first round: N paths, one question) compute the question once, only the
first of them runs in the batch's first pass, the others in a second pass that finds its full blocks cached.

Memory. The cache is LRU-bounded by entry count, and after every batch it evicts until a share of the
KV pool is free. Before each path is started the verifier reserves the blocks it may need, evicting LRU
entries first; if the pool is still short it runs the paths started so far (a *wave*) and continues,
so a batch larger than the pool is scored in several waves instead of stalling the engine.
`clear()` / `close()` release everything the cache holds.

Context. A PRM input is never truncated. A path whose input exceeds the PRM's context (its
max_position_embeddings, or EngineConfig.max_model_len when smaller) gets an error result with
`exceeds_context` set, carrying the scores of the steps that fit (possibly none); the rest of the batch is
scored as usual. The search finishes such a path at its last step and its completed path carries the
error (`CompletedPath.score_error`, the server's `score_error`): its score covers only the steps the PRM
read (docs/architecture.md, step 8).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from specscale.config import EngineConfig
from specscale.engine.engine import Engine
from specscale.engine.sequence import FinishReason, SequenceStatus
from specscale.model.loader import read_hf_config
from specscale.seam import KVUsage, ScoreRequest, ScoreResult
from specscale.verify.formats import PRMFormat, PRMInput, clean_steps, make_format

# the PRM engine's batch limits, wherever one is built (a pipeline's, a PRM replica's, a simulation's, a
# benchmark's): a lazy batch of many steps runs as one prefill of up to this many tokens and sequences
PRM_MAX_BATCHED_TOKENS = 8192
PRM_MAX_SEQS = 1024


@dataclass(frozen=True)
class VerifierConfig:
    """A verifier: its PRM engine, the input format and the bounds of its step-boundary cache.

    format: "qwen-math-prm" or "rlhflow"; None picks it from the checkpoint's config.json.
    trust_special_tokens: read special-token text in questions and steps as control tokens (trusted
        callers only; by default it is plain text, see verify/formats.py).
    max_cached_prefixes: most paused sequences the cache keeps.
    min_free_block_fraction: after each batch, cached prefixes are evicted (LRU first) until at
        least this share of the PRM engine's KV blocks is free.
    """

    engine: EngineConfig
    format: str | None = None
    trust_special_tokens: bool = False
    max_cached_prefixes: int = 1024
    min_free_block_fraction: float = 0.25

    def __post_init__(self) -> None:
        if self.max_cached_prefixes < 0:
            raise ValueError(f"max_cached_prefixes must be >= 0, got {self.max_cached_prefixes}")
        if not 0 <= self.min_free_block_fraction <= 1:
            raise ValueError(f"min_free_block_fraction must be in [0, 1], got {self.min_free_block_fraction}")


@dataclass
class VerifierStats:
    """Running totals since the verifier was built."""

    paths: int = 0
    computed_tokens: int = 0  # tokens run through the PRM
    reused_tokens: int = 0  # tokens a path took from a cached prefix instead of computing them
    cache_hits: int = 0  # paths that started from a cached prefix
    evictions: int = 0
    waves: int = 0  # engine runs; more than one per batch means the KV pool was short


@dataclass(frozen=True)
class CachedPrefix:
    """A PAUSED PRM sequence holding the KV of a path's input through some step, and those steps' scores."""

    seq_id: int
    num_tokens: int
    step_scores: tuple[float, ...]


def boundary_keys(prm_input: PRMInput) -> list[int]:
    """keys[j] identifies token_ids[:step_ends[j]]: a hash chained over the per-step token pieces."""
    keys, key, start = [], 0, 0
    for end in prm_input.step_ends:
        key = hash((key, prm_input.token_ids[start:end]))
        keys.append(key)
        start = end
    return keys


class StepPrefixCache:
    """Paused PRM sequences at step boundaries, LRU ordered; it aborts what it evicts."""

    def __init__(self, engine: Engine, max_entries: int):
        self.engine = engine
        self.max_entries = max_entries
        self.entries: OrderedDict[int, CachedPrefix] = OrderedDict()  # boundary key -> entry, LRU first

    def __len__(self) -> int:
        return len(self.entries)

    def longest_prefix(
        self, prm_input: PRMInput, keys: list[int], touch: bool = True
    ) -> tuple[int, CachedPrefix | None]:
        """(steps covered, entry) of the longest cached boundary that is a prefix of prm_input."""
        for num_steps in range(len(keys), 0, -1):
            entry = self.entries.get(keys[num_steps - 1])
            if entry is not None and self._holds(entry, prm_input.token_ids[: prm_input.step_ends[num_steps - 1]]):
                if touch:
                    self.entries.move_to_end(keys[num_steps - 1])
                return num_steps, entry
        return 0, None

    def _holds(self, entry: CachedPrefix, token_ids: tuple[int, ...]) -> bool:
        """The entry's sequence still has its KV and holds exactly these tokens (no hash collision)."""
        seq = self.engine.get(entry.seq_id)
        return (
            seq is not None and seq.status == SequenceStatus.PAUSED and entry.num_tokens == len(token_ids)
            and seq.num_computed_tokens == entry.num_tokens and tuple(seq.token_ids) == token_ids
        )

    def insert(self, key: int, entry: CachedPrefix) -> None:
        if key in self.entries or self.max_entries == 0:
            self.engine.abort(entry.seq_id)
            return
        self.entries[key] = entry
        while len(self.entries) > self.max_entries:
            self.evict_lru()

    def evict_lru(self, keep: CachedPrefix | None = None) -> bool:
        """Abort the least recently used entry other than keep; False when there is none."""
        for key, entry in self.entries.items():
            if entry is not keep:
                del self.entries[key]
                self.engine.abort(entry.seq_id)
                return True
        return False

    def clear(self) -> None:
        for entry in self.entries.values():
            self.engine.abort(entry.seq_id)
        self.entries.clear()


@dataclass(frozen=True)
class _Segment:
    """Tokens to run for a path and the positions whose readouts are its new step scores."""

    token_ids: list[int]
    readout_positions: list[int]


@dataclass
class _Path:
    """One request while a batch is scored."""

    num_steps: int  # non-empty steps
    target: PRMInput | None = None  # the input for the steps that fit in the context
    keys: list[int] = field(default_factory=list)
    error: str | None = None  # context limit, empty path, KV pool too small
    exceeds_context: bool = False  # the error is the context limit
    fault: str | None = None  # the engine's readouts did not match the request: no scores are trusted
    seq_id: int | None = None  # the engine sequence computing it
    segment: _Segment | None = None  # what the engine is computing for it
    base_scores: tuple[float, ...] = ()
    new_scores: tuple[float, ...] = ()
    computed_tokens: int = 0
    copy_of: _Path | None = None  # an identical path of the same batch, computed once
    question: str = ""

    def result(self) -> ScoreResult:
        source = self.copy_of
        if source is None:
            if self.fault is not None:
                return ScoreResult((), self.num_steps, self.fault, self.computed_tokens)
            return ScoreResult(self.base_scores + self.new_scores, self.num_steps, self.error, self.computed_tokens,
                               self.exceeds_context)
        if source.target is None or source.fault is not None:  # the shared computation failed
            return ScoreResult((), self.num_steps, source.fault or source.error)
        return ScoreResult(source.base_scores + source.new_scores, self.num_steps, self.error,
                           exceeds_context=self.exceeds_context)


class Verifier:
    """Scores (question, steps) paths with a PRM engine; see the module docstring."""

    def __init__(self, config: VerifierConfig, engine: Engine | None = None):
        """engine: a PRM engine built elsewhere (the simulator's); None builds one from config.engine. A given
        engine needs config.format named, as there is no config.json to read it from."""
        if engine is not None and config.format is None:
            raise ValueError("a verifier on a given engine needs its PRM format named (VerifierConfig.format)")
        self.config = config
        self.engine = engine or Engine(config.engine)
        hf_config = read_hf_config(config.engine.model) if config.format is None else {}
        self.format: PRMFormat = make_format(self.engine.tokenizer, hf_config, config.format,
                                             config.trust_special_tokens)
        self._check_head()
        self.cache = StepPrefixCache(self.engine, config.max_cached_prefixes)
        self.stats = VerifierStats()

    def _check_head(self) -> None:
        has_lm_head = self.engine.runner.head_size != 2
        if self.format.uses_lm_head != has_lm_head:
            kind = "an LM head" if self.format.uses_lm_head else "a 2-class score head"
            raise ValueError(f"format {self.format.name} needs {kind}; {self.config.engine.model} has another")

    @property
    def kv_usage(self) -> KVUsage:
        """The PRM engine's KV blocks in use (the cached step prefixes hold some)."""
        return self.engine.block_manager.usage

    @property
    def max_input_tokens(self) -> int:
        """The PRM's context: the longest PRM input a path may have."""
        return self.engine.max_model_len

    # ---- public API ------------------------------------------------------------------------
    def score(self, requests: Sequence[ScoreRequest]) -> list[ScoreResult]:
        """Score every path in one engine batch (several waves if the KV pool is short)."""
        self._check_open()
        paths = [self._plan(request) for request in requests]
        self._link_copies(paths)
        first, later = self._share_questions([p for p in paths if p.target is not None and p.copy_of is None])
        self._compute(first)
        self._compute(later)
        self._trim_cache()
        self.stats.paths += len(paths)
        return [path.result() for path in paths]

    def tokens_to_compute(self, request: ScoreRequest) -> int:
        """PRM tokens scoring this request would run now, after the cache lookup (the LV trigger's unit)."""
        self._check_open()
        path = self._plan(request)
        if path.target is None:
            return 0
        _, base = self.cache.longest_prefix(path.target, path.keys, touch=False)
        return len(path.target.token_ids) - (base.num_tokens if base else 0)

    def clear(self) -> None:
        """Release every cached prefix (all PRM KV blocks the verifier holds)."""
        self._check_open()
        self.cache.clear()

    def close(self) -> None:
        """Release everything and drop the engine; the verifier cannot score afterwards."""
        if self.engine is not None:
            self.cache.clear()
            self.engine = None

    def __enter__(self) -> Verifier:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- planning ----------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self.engine is None:
            raise RuntimeError("the verifier is closed")

    def _plan(self, request: ScoreRequest) -> _Path:
        steps = clean_steps(request.steps)
        path = _Path(num_steps=len(steps), question=request.question)
        if not steps:
            path.error = "no non-empty steps to score"
            return path
        full = self.format.encode(request.question, steps)
        fitting = sum(end <= self.max_input_tokens for end in full.step_ends)
        if fitting < len(steps):
            path.exceeds_context = True
            path.error = (f"PRM input of {len(full.token_ids)} tokens exceeds the PRM context of "
                          f"{self.max_input_tokens}: {fitting} of {len(steps)} steps fit")
        if fitting:
            path.target = full.first_steps(fitting)
            path.keys = boundary_keys(path.target)
        return path

    @staticmethod
    def _link_copies(paths: list[_Path]) -> None:
        """Identical inputs in one batch are computed once."""
        first_of: dict[tuple[int, ...], _Path] = {}
        for path in paths:
            if path.target is not None:
                original = first_of.setdefault(path.target.token_ids, path)
                path.copy_of = original if original is not path else None

    def _share_questions(self, paths: list[_Path]) -> tuple[list[_Path], list[_Path]]:
        """(first pass, second pass): a fresh path (nothing cached) whose question an earlier fresh path of the
        batch has waits for the second pass, where the engine's prefix cache holds that question's blocks."""
        if not self.engine.block_manager.enable_prefix_caching:
            return paths, []
        first: list[_Path] = []
        later: list[_Path] = []
        questions: set[str] = set()
        for path in paths:
            fresh = self.cache.longest_prefix(path.target, path.keys, touch=False)[1] is None
            (later if fresh and path.question in questions else first).append(path)
            if fresh:
                questions.add(path.question)
        return first, later

    # ---- computing ---------------------------------------------------------------------------
    def _compute(self, paths: list[_Path]) -> None:
        wave: list[_Path] = []
        reserved = 0  # blocks the started, not yet run paths may still take
        for path in paths:
            base_steps, base = self.cache.longest_prefix(path.target, path.keys)
            if base_steps == path.target.num_steps:  # nothing new to compute
                self._use_base(path, base)
                continue
            need = self._blocks_needed(path.target, base)
            if not self._make_room(reserved + need, keep=base) and wave:
                self._run_wave(wave)
                wave, reserved = [], 0
                base_steps, base = self.cache.longest_prefix(path.target, path.keys)
                need = self._blocks_needed(path.target, base)
            if not self._make_room(reserved + need, keep=base):
                path.error = f"PRM input of {len(path.target.token_ids)} tokens does not fit in the PRM KV pool"
                path.target = None
                continue
            self._start(path, base_steps, base)
            wave.append(path)
            reserved += need
        if wave:
            self._run_wave(wave)

    def _use_base(self, path: _Path, base: CachedPrefix) -> None:
        path.base_scores = base.step_scores
        self.stats.cache_hits += 1
        self.stats.reused_tokens += base.num_tokens

    def _start(self, path: _Path, base_steps: int, base: CachedPrefix | None) -> None:
        """Fork the cached prefix and extend it with the rest (or add the whole input): readouts at new steps."""
        target = path.target
        if base is None:
            path.segment = _Segment(list(target.token_ids), list(target.score_positions))
            path.seq_id = self.engine.add(path.segment.token_ids, None, readout_positions=path.segment.readout_positions)
            return
        new_positions = list(target.score_positions[base_steps:])
        path.segment = _Segment(list(target.token_ids[base.num_tokens :]), new_positions)
        (path.seq_id,) = self.engine.fork(base.seq_id, 1)
        self.engine.extend(path.seq_id, None, token_ids=path.segment.token_ids, readout_positions=new_positions)
        self._use_base(path, base)

    def _blocks_needed(self, target: PRMInput, base: CachedPrefix | None) -> int:
        """Upper bound on the new KV blocks computing target takes (a shared partial block is copied)."""
        size = self.engine.block_manager.block_size
        total = -(-len(target.token_ids) // size)
        if base is None:
            return total
        return total - (-(-base.num_tokens // size)) + int(base.num_tokens % size != 0)

    def _make_room(self, blocks: int, keep: CachedPrefix | None) -> bool:
        """Evict cached prefixes (LRU first, never keep) until blocks are free; False if they cannot be."""
        while self.engine.block_manager.num_free_blocks < blocks:
            if not self.cache.evict_lru(keep):
                return False
            self.stats.evictions += 1
        return True

    def _run_wave(self, wave: list[_Path]) -> None:
        """Step the engine until every path of the wave has its readouts; cache the paused sequences."""
        by_seq = {path.seq_id: path for path in wave}
        waiting = set(by_seq)
        limit = sum(len(p.target.token_ids) for p in wave) + len(wave) + 8  # each step computes >= 1 token
        for _ in range(limit):
            if not waiting:
                break
            for out in self.engine.step():
                if out.seq_id in waiting and out.finish_reason == FinishReason.READOUT:
                    self._take_readouts(by_seq[out.seq_id], out.readouts)
                    waiting.discard(out.seq_id)
        if waiting:
            raise RuntimeError(f"the PRM engine stopped making progress with {len(waiting)} paths unscored")
        self.stats.waves += 1
        for path in wave:
            self._finish(path)

    def _take_readouts(self, path: _Path, readouts) -> None:
        count, expected = (0 if readouts is None else len(readouts)), len(path.segment.readout_positions)
        if count != expected:  # an engine fault: never pass off misaligned scores
            path.fault = f"the PRM engine returned {count} readouts where {expected} were asked for"
        else:
            path.new_scores += tuple(self.format.scores(readouts))

    def _finish(self, path: _Path) -> None:
        seq = self.engine.get(path.seq_id)
        path.computed_tokens = seq.usage.computed_tokens
        self.stats.computed_tokens += path.computed_tokens
        if path.fault is not None:  # never cache a sequence whose scores are not trusted
            self.engine.abort(path.seq_id)
            return
        scores = path.base_scores + path.new_scores
        self.cache.insert(path.keys[-1], CachedPrefix(path.seq_id, len(seq.token_ids), scores))

    def _trim_cache(self) -> None:
        """Keep a share of the KV pool free between batches so the cache never starves the engine."""
        manager = self.engine.block_manager
        floor = int(self.config.min_free_block_fraction * manager.num_blocks)
        while manager.num_free_blocks < floor and self.cache.evict_lru():
            self.stats.evictions += 1
