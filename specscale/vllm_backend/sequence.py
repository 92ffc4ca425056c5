"""VllmSequence: one of the runtime's sequences as the vLLM generator backend holds it — its tokens (the
context a vLLM request is added from), its segment so far, its lane, and where it stands — and the pure rules
that decide when its segment ends (the same rules, in the same order, as `engine/engine.py`'s `_stop_reason`).

vLLM holds no paused sequence: a request ends when its segment does, and a sequence stopped at a step's end
lives on here as tokens whose KV stays in vLLM's prefix cache (its full blocks), so a branch from it is a new
request whose prompt is these tokens plus the branch's own (docs/design.md, "vLLM backend").
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from specscale.seam import EndReason, SamplingParams, SequenceId, SequenceState

LANE_SEED_STRIDE = 1_000_003  # lane j > 0 of a seeded sequence without lane seeds: seed + j * stride


class Phase(enum.Enum):
    QUEUED = "queued"  # waiting for the backend to add it to vLLM (the speculative row budget may hold it)
    RUNNING = "running"  # a vLLM request is generating it
    PAUSED = "paused"  # a PauseSequence ended its request; a resume adds it again from its tokens
    STOPPED = "stopped"  # its segment ended at a step's end: tokens kept for branches, nothing in vLLM
    READOUT = "readout"  # a prefill-only sequence was computed: tokens kept for branches, nothing in vLLM


@dataclass(eq=False)
class VllmSequence:
    """seq_id: the runtime's id; tokens: the whole context (prompt, then this segment's tokens); params None:
    prefill-only; seed: this lane's sampling seed; segment_tokens: tokens generated in this segment so far.
    Compared by identity (the generator's queues look sequences up by it)."""

    seq_id: SequenceId
    tokens: list[int]
    params: SamplingParams | None
    priority: int
    lane: int = 0
    seed: int | None = None
    continues: bool = False  # its requests continue KV another request computed (a branch, a resume)
    resuming: bool = False  # its next request resumes it after a pause
    phase: Phase = Phase.QUEUED
    segment_tokens: int = 0
    request_id: str | None = None
    requests_added: int = 0
    stop_tail: bytes = b""
    announce_split_from: SequenceId | None = None  # a CD lane's split, reported in the next step
    announced: bool = True
    cached_tokens: list[int] = field(default_factory=list)  # vLLM's num_cached_tokens of each request added

    @property
    def speculative(self) -> bool:
        return self.priority < 0

    @property
    def prefill_only(self) -> bool:
        return self.params is None

    def remaining_tokens(self) -> int:
        """The segment's tokens still allowed (a resumed request asks for these only)."""
        assert self.params is not None
        return max(1, self.params.max_new_tokens - self.segment_tokens)


def lane_seeds_for(params: SamplingParams | None, multiplicity: int,
                   lane_seeds: tuple[int, ...] | None) -> list[int | None]:
    """One seed per logical copy: lane_seeds as given, else derived from params.seed (lane 0 takes it), else
    None for every lane (vLLM's own generator)."""
    if lane_seeds is not None:
        if len(lane_seeds) != multiplicity:
            raise ValueError(f"{len(lane_seeds)} lane seeds for multiplicity {multiplicity}")
        return list(lane_seeds)
    if params is None or params.seed is None:
        return [None] * multiplicity
    return [(params.seed + j * LANE_SEED_STRIDE) % 2**63 for j in range(multiplicity)]


class SegmentRules:
    """When a segment ends, token by token, as our engine decides it: EOS (unless ignored), a stop string in
    the segment's bytes (across token boundaries), the segment's token cap, the context limit.

    `advance` takes a request's new tokens of one vLLM step at once where none of them can end the segment (no
    EOS among them, both caps past the last, no stop string in the tail's and their bytes: every token's own
    check reads a part of those bytes), and token by token otherwise, so it ends where the per-token rules do."""

    def __init__(self, token_bytes: list[bytes], eos_token_ids: frozenset[int], max_model_len: int):
        self.token_bytes = token_bytes
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len
        self._vocab = len(token_bytes)
        self._stops: dict[tuple[str, ...], tuple[tuple[bytes, ...], int, bytes | None]] = {}

    def take(self, seq: VllmSequence, new_tokens: list[int]) -> tuple[list[int], SequenceState, EndReason]:
        """Append new_tokens to seq up to the one that ends its segment: (the tokens taken, the sequence's
        state after them, why it ended)."""
        taken, state, reason = self.advance(seq, tuple(new_tokens))
        return list(taken), state, reason

    def advance(self, seq: VllmSequence, new_tokens: tuple[int, ...]
                ) -> tuple[tuple[int, ...], SequenceState, EndReason]:
        """`take`, with the tokens as a tuple and the ones taken as a tuple (new_tokens itself when it takes all)."""
        params = seq.params
        assert params is not None
        n = len(new_tokens)
        tokens = seq.tokens
        if (n and seq.segment_tokens + n < params.max_new_tokens and len(tokens) + n < self.max_model_len
                and (params.ignore_eos or self.eos_token_ids.isdisjoint(new_tokens))):
            stop = params.stop
            if stop:
                stops, keep, single = self._stops.get(stop) or self._stop_entry(stop)
                token_bytes, vocab = self.token_bytes, self._vocab
                if n == 1:
                    token = new_tokens[0]
                    text = seq.stop_tail + (token_bytes[token] if token < vocab else b"")
                else:
                    text = seq.stop_tail + b"".join([token_bytes[t] if t < vocab else b"" for t in new_tokens])
                if not (single in text if single is not None else any(s in text for s in stops)):
                    seq.stop_tail = text[-keep:] if keep else b""
                    tokens.extend(new_tokens)
                    seq.segment_tokens += n
                    return new_tokens, SequenceState.GENERATING, EndReason.STOP
            else:
                tokens.extend(new_tokens)
                seq.segment_tokens += n
                return new_tokens, SequenceState.GENERATING, EndReason.STOP
        taken: list[int] = []
        for token in new_tokens:
            tokens.append(token)
            seq.segment_tokens += 1
            taken.append(token)
            ended = self._end(seq, token)
            if ended is not None:
                return tuple(taken), *ended
        return tuple(taken), SequenceState.GENERATING, EndReason.STOP

    def _end(self, seq: VllmSequence, token: int) -> tuple[SequenceState, EndReason] | None:
        params = seq.params
        assert params is not None
        if token in self.eos_token_ids and not params.ignore_eos:
            return SequenceState.FINISHED, EndReason.STOP
        if params.stop and self._hits_stop(seq, params.stop, token):
            return SequenceState.STOPPED, EndReason.STOP
        if seq.segment_tokens >= params.max_new_tokens or len(seq.tokens) >= self.max_model_len:
            return SequenceState.FINISHED, EndReason.LENGTH
        return None

    def _stop_entry(self, stop: tuple[str, ...]) -> tuple[tuple[bytes, ...], int, bytes | None]:
        """stop's strings as bytes, how many of a segment's last bytes a stop string can span into, and the one
        stop string when there is one."""
        entry = self._stops.get(stop)
        if entry is None:
            stops = tuple(s.encode("utf-8") for s in stop)
            entry = self._stops[stop] = (stops, max(len(s) for s in stops) - 1, stops[0] if len(stops) == 1 else None)
        return entry

    def _hits_stop(self, seq: VllmSequence, stop: tuple[str, ...], token: int) -> bool:
        stops, keep, _ = self._stop_entry(stop)
        text = seq.stop_tail + (self.token_bytes[token] if token < self._vocab else b"")
        if any(s in text for s in stops):
            seq.stop_tail = b""
            return True
        seq.stop_tail = text[-keep:] if keep else b""
        return False
