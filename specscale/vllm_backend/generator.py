"""VllmGenerator: vLLM's V1 engine (`engine_client.py`) as a `GeneratorBackend` (runtime/backend.py).

Each `SequenceOp` becomes vLLM requests (docs/design.md, "vLLM backend", says what is exact and what is not):

- `StartSequence` -> a request from its token ids; a prefill-only one (params None) asks for one token, thrown
  away, and reports READOUT once vLLM has computed (and cached) its prompt;
- `BranchSequence` -> a request whose prompt is the source's tokens plus `token_ids`: the source's KV is found
  in vLLM's prefix cache (its full blocks; the tokens past the last full block are recomputed), counted in
  `cache_stats`;
- multiplicity m (CD) -> m requests, one per lane, each with its lane's seed (with `request_seeds` off, every
  request draws from vLLM's own stream: engine_client.py `seeds_per_request`); lanes 1..m-1 are reported as
  split off the first in the next step, before any of them drew a token (vLLM runs each lane as its own row
  from its first token: CD's shared rows are lost, its lanes and seeds are kept);
- `AbortSequence` -> abort (vLLM frees the request's blocks at once); `PauseSequence` -> abort, the tokens kept;
  `PrioritizeSequence(resume=True)` -> a new request from the tokens so far (prefix cache), for the segment's
  tokens left; a re-prioritised running request keeps vLLM's priority it was added with (vLLM has no call to
  change it), the new one applies from its next request;
- priority -> vLLM's priority scheduling; the speculative row budget (`DeviceProperties.spare_rows`) holds
  speculative sequences back here while vLLM runs that many requests, as our scheduler does per iteration.

A segment ends by `sequence.py` `SegmentRules` on the tokens' bytes ("\\n\\n" across token boundaries, as our
engine), after which the request is aborted if vLLM has not finished it; `kv_usage` reads vLLM's block pool.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from specscale.seam import (
    AbortSequence,
    BranchSequence,
    EndReason,
    KVUsage,
    PauseSequence,
    PrioritizeSequence,
    SequenceId,
    SequenceOp,
    SequenceState,
    SequenceUpdate,
    StartSequence,
)
from specscale.tokenizer import Tokenizer
from specscale.vllm_backend.engine_client import RequestStep
from specscale.vllm_backend.sequence import Phase, SegmentRules, VllmSequence, lane_seeds_for

_instances = itertools.count()


class RequestEngine(Protocol):
    """What the generator needs of vLLM (`engine_client.py` `VllmEngineClient`; a scripted one in the tests)."""

    max_model_len: int

    def add(self, request_id: str, prompt_ids: Sequence[int], params, seed: int | None, max_tokens: int,
            priority: int) -> None: ...

    def abort(self, request_ids: Sequence[str]) -> None: ...

    def step(self) -> list[RequestStep]: ...

    def has_unfinished(self) -> bool: ...

    @property
    def num_unfinished(self) -> int: ...

    @property
    def kv_usage(self) -> KVUsage: ...


@dataclass
class CacheStats:
    """Prefix-cache use of the requests that continue a sequence (branches, resumes): prompt tokens, the
    tokens vLLM found cached, and how many such requests."""

    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def recomputed_per_request(self) -> float:
        return (self.prompt_tokens - self.cached_tokens) / self.requests if self.requests else 0.0


class VllmGenerator:
    def __init__(self, engine: RequestEngine, tokenizer: Tokenizer, spare_rows: int | None = None,
                 request_seeds: bool = True):
        """request_seeds: send each lane's seed with its request (False: vLLM draws from its own stream; the
        platforms where that is chosen, and what it costs: engine_client.py `seeds_per_request`)."""
        self.engine = engine
        self.request_seeds = request_seeds
        self.tokenizer = tokenizer
        self.spare_rows = spare_rows
        self.rules = SegmentRules(tokenizer.token_bytes, frozenset(tokenizer.eos_token_ids), engine.max_model_len)
        self.sequences: dict[SequenceId, VllmSequence] = {}
        self._by_request: dict[str, VllmSequence] = {}
        self._queue: list[VllmSequence] = []  # QUEUED, in arrival order
        self._announce: list[VllmSequence] = []  # CD lanes whose split the next step reports
        self._prefix = f"s{next(_instances)}"
        self._fresh: dict[str, int] = {}  # requests added whose first output is still to come -> prompt length
        self._overlong: list[VllmSequence] = []  # sequences whose context is full before they start
        self.cache_stats = CacheStats()  # branches (and resumes, which are counted apart as well)
        self.resume_stats = CacheStats()  # resumes after a pause: abort + re-add through the prefix cache

    # ---- GeneratorBackend ------------------------------------------------------------------------
    def apply(self, ops: Sequence[SequenceOp]) -> None:
        for op in ops:
            if isinstance(op, StartSequence):
                self._open(op.seq_id, list(op.token_ids), op, op.split_ids, continues=False)
            elif isinstance(op, BranchSequence):
                source = self.sequences[op.source]
                self._open(op.seq_id, source.tokens + list(op.token_ids), op, op.split_ids, continues=True)
            elif isinstance(op, AbortSequence):
                self._abort(op.seq_id)
            elif isinstance(op, PauseSequence):
                self._pause(op.seq_id)
            elif isinstance(op, PrioritizeSequence):
                self._prioritize(op)

    def step(self) -> list[SequenceUpdate]:
        updates = self._announcements() if self._announce or self._overlong else []
        if self._queue:
            self._admit()
        if self.engine.has_unfinished():
            by_request, update_of = self._by_request, self._update
            for out in self.engine.step():
                seq = by_request.get(out.request_id)
                if seq is not None:  # else aborted or paused since it was scheduled
                    update = update_of(seq, out)
                    if update is not None:
                        updates.append(update)
        return updates

    def has_work(self) -> bool:
        return bool(self._announce) or self.engine.has_unfinished() or any(self._admissible(s) for s in self._queue)

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(token_ids))

    @property
    def num_live_sequences(self) -> int:
        return len(self.sequences)

    @property
    def kv_usage(self) -> KVUsage:
        return self.engine.kv_usage

    @property
    def num_requests(self) -> int:
        """vLLM's unfinished requests (0 once every sequence ended, stopped or was aborted)."""
        return self.engine.num_unfinished

    # ---- operations ------------------------------------------------------------------------------
    def _open(self, seq_id: SequenceId, tokens: list[int], op: StartSequence | BranchSequence,
              split_ids: tuple[SequenceId, ...], continues: bool) -> None:
        seeds = lane_seeds_for(op.params, op.multiplicity, op.lane_seeds)
        if len(split_ids) < op.multiplicity - 1:
            raise ValueError(f"multiplicity {op.multiplicity} needs {op.multiplicity - 1} split ids")
        ids = [seq_id, *split_ids[:op.multiplicity - 1]]
        for lane, (lane_id, seed) in enumerate(zip(ids, seeds, strict=True)):
            seq = VllmSequence(lane_id, list(tokens), op.params, op.priority, lane, seed, continues=continues)
            if op.multiplicity > 1:
                seq.announced = False
                seq.announce_split_from = None if lane == 0 else seq_id
                self._announce.append(seq)
            self.sequences[lane_id] = seq
            self._queue.append(seq)

    def _abort(self, seq_id: SequenceId) -> None:
        seq = self.sequences.pop(seq_id, None)
        if seq is None:
            return
        self._end_request(seq)
        if seq in self._queue:
            self._queue.remove(seq)
        if not seq.announced:  # its family's lanes were never reported: they go with it
            for lane in [s for s in self._announce if s.announce_split_from == seq_id]:
                self._abort(lane.seq_id)
            self._announce = [s for s in self._announce if s is not seq]

    def _pause(self, seq_id: SequenceId) -> None:
        seq = self.sequences.get(seq_id)
        if seq is None or seq.phase not in (Phase.QUEUED, Phase.RUNNING):
            return
        self._end_request(seq)
        if seq in self._queue:
            self._queue.remove(seq)
        seq.phase = Phase.PAUSED
        for lane in [s for s in self._announce if s.announce_split_from == seq_id]:
            self._pause(lane.seq_id)

    def _prioritize(self, op: PrioritizeSequence) -> None:
        seq = self.sequences.get(op.seq_id)
        if seq is None:
            return
        seq.priority = op.priority
        if op.resume and seq.phase == Phase.PAUSED:
            seq.phase = Phase.QUEUED
            seq.continues = seq.resuming = True
            self._queue.append(seq)
        for lane in [s for s in self._announce if s.announce_split_from == op.seq_id]:
            self._prioritize(PrioritizeSequence(lane.seq_id, op.priority, op.resume))

    # ---- requests --------------------------------------------------------------------------------
    def _admissible(self, seq: VllmSequence) -> bool:
        """A speculative sequence joins only while vLLM runs fewer than spare_rows requests (the row budget)."""
        return not seq.speculative or self.spare_rows is None or self.engine.num_unfinished < self.spare_rows

    def _admit(self) -> None:
        waiting = sorted(self._queue, key=lambda s: -s.priority)  # stable: arrival order within a priority
        admitted: set[int] = set()  # id() of the sequences leaving the queue (rebuilt once, in arrival order)
        try:
            for seq in waiting:
                if not self._admissible(seq):  # a speculative one past the row budget: so are the rest (by
                    break  # priority), as adding requests only adds to vLLM's unfinished ones
                admitted.add(id(seq))
                if seq.params is not None and len(seq.tokens) >= self.engine.max_model_len:
                    seq.phase = Phase.RUNNING  # nothing left to generate: ends as cut by the context next step
                    seq.request_id = None
                    self._overlong.append(seq)
                    continue
                seq.requests_added += 1
                seq.request_id = f"{self._prefix}-{seq.seq_id}-{seq.requests_added}"
                max_tokens = 1 if seq.params is None else seq.remaining_tokens()
                seed = seq.seed if self.request_seeds else None
                self.engine.add(seq.request_id, seq.tokens, seq.params, seed, max_tokens, seq.priority)
                self._by_request[seq.request_id] = seq
                self._fresh[seq.request_id] = len(seq.tokens)
                seq.phase = Phase.RUNNING
        finally:
            if admitted:
                self._queue = [s for s in self._queue if id(s) not in admitted]

    def _end_request(self, seq: VllmSequence) -> None:
        """Abort seq's vLLM request if it has one still running."""
        if seq.request_id is not None:
            if self._by_request.pop(seq.request_id, None) is not None:
                self.engine.abort([seq.request_id])
            self._fresh.pop(seq.request_id, None)
            seq.request_id = None

    # ---- updates ---------------------------------------------------------------------------------
    def _announcements(self) -> list[SequenceUpdate]:
        """CD: every lane started since the last step, reported as split off its first lane (lane 0 first)."""
        updates = []
        for seq in self._announce:
            seq.announced = True
            updates.append(SequenceUpdate(seq.seq_id, (), SequenceState.GENERATING, 1, (seq.lane,),
                                          seq.announce_split_from))
        self._announce = []
        for seq in self._overlong:
            self.sequences.pop(seq.seq_id, None)
            updates.append(SequenceUpdate(seq.seq_id, (), SequenceState.FINISHED, 1, (seq.lane,),
                                          end_reason=EndReason.LENGTH))
        self._overlong.clear()
        return updates

    def _update(self, seq: VllmSequence, out: RequestStep) -> SequenceUpdate | None:
        """seq's update from its request's step out (seq: the sequence of out's request)."""
        prompt_tokens = self._fresh.pop(out.request_id, None) if self._fresh else None
        if prompt_tokens is not None:  # its first output: how much of its prompt vLLM found cached
            seq.cached_tokens.append(out.cached_tokens)
            for stats in ([self.cache_stats] if seq.continues else []) + ([self.resume_stats] if seq.resuming else []):
                stats.requests += 1
                stats.prompt_tokens += prompt_tokens
                stats.cached_tokens += out.cached_tokens
            seq.resuming = False
        if seq.params is None:  # a prefill: its one token is thrown away
            if not out.finished:
                return None
            self._finish_request(seq, stop_vllm=False)
            seq.phase = Phase.READOUT
            return SequenceUpdate(seq.seq_id, (), SequenceState.READOUT, 1, (seq.lane,))
        new_tokens = out.new_token_ids
        if type(new_tokens) is not tuple:
            new_tokens = tuple(new_tokens)
        taken, state, reason = self.rules.advance(seq, new_tokens)
        if state is SequenceState.GENERATING:
            if not out.finished:
                return SequenceUpdate(seq.seq_id, taken, state, 1, (seq.lane,), None, reason)
            state, reason = SequenceState.FINISHED, EndReason.LENGTH  # vLLM ended it (its context limit, say)
        if state == SequenceState.STOPPED:
            self._finish_request(seq, stop_vllm=not out.finished)
            seq.phase, seq.segment_tokens, seq.stop_tail = Phase.STOPPED, 0, b""
        elif state == SequenceState.FINISHED:
            self._finish_request(seq, stop_vllm=not out.finished)
            self.sequences.pop(seq.seq_id, None)
        return SequenceUpdate(seq.seq_id, taken, state, 1, (seq.lane,), end_reason=reason)

    def _finish_request(self, seq: VllmSequence, stop_vllm: bool) -> None:
        assert seq.request_id is not None
        self._by_request.pop(seq.request_id, None)
        self._fresh.pop(seq.request_id, None)
        if stop_vllm:
            self.engine.abort([seq.request_id])
        seq.request_id = None
