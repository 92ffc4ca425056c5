"""Verification policies: when a finished step goes to the PRM and how the verify queue batches it
(docs/design.md, "Verification"). A preset names one by `SearchConfig.verification`. `Search` calls its hooks
when a step finishes (`on_step_finished`) and when a round has finished generating (`on_round_generated`).

- round: a request's whole round once it has finished generating, batched across requests (beam search);
- immediate: each step as soon as it finishes, batched across requests (speculative variants);
- lazy: each step as it finishes, held in the verifier's lazy queue until a lazy-verification trigger holds;
- lazy_round: a request's whole round once it has finished generating, held in the same lazy queue (an
  ablation, in no preset). A finished round is a set of complete sibling groups, so with the sibling-group
  trigger (docs/design.md, "Verification") it flushes at once; with `SearchConfig.lv_sibling_trigger = False`
  whole rounds wait for the token, deferral or age trigger (cross-request batching of rounds);
- per_request: a request's whole round (with its LookAhead continuations), one request per PRM call (FastTTS).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from specscale.search.tree import Candidate, Round


class BatchMode(Enum):
    """How the runtime's verify queue batches a policy's steps (`runtime/verify_queue.py` carries each out)."""

    AT_ONCE = "at_once"  # ready at once, batched across requests
    LAZY = "lazy"  # held in the lazy queue until a lazy-verification trigger holds
    ONE_REQUEST = "one_request"  # ready at once, one request per PRM call (FastTTS)


AT_ONCE, LAZY, ONE_REQUEST = BatchMode.AT_ONCE, BatchMode.LAZY, BatchMode.ONE_REQUEST


@dataclass(frozen=True)
class Verification:
    name: str
    per_step: bool  # True: a step is sent as it finishes; False: a round at once, when it has finished generating
    batching: BatchMode  # how `runtime/verify_queue.py` batches this policy's steps

    @property
    def is_lazy(self) -> bool:
        return self.batching is LAZY

    def on_step_finished(self, search, c: Candidate) -> list:
        """A step finished as candidate c: a per-step policy sends it now (saying whether its sibling group
        is complete, lazy verification's trigger 2)."""
        if not self.per_step:
            return []
        return [search._verify(c, completes_group=search._group_complete(c.expansion))]

    def on_round_generated(self, search, rd: Round) -> list:
        """Round rd has finished generating: a round-at-once policy sends it once it is the round being decided."""
        if self.per_step or rd.index != search.last_decided + 1:
            return []
        return search._verify_round(rd)


VERIFICATIONS = {
    "round": Verification("round", per_step=False, batching=AT_ONCE),
    "immediate": Verification("immediate", per_step=True, batching=AT_ONCE),
    "lazy": Verification("lazy", per_step=True, batching=LAZY),
    "lazy_round": Verification("lazy_round", per_step=False, batching=LAZY),
    "per_request": Verification("per_request", per_step=False, batching=ONE_REQUEST),
}
