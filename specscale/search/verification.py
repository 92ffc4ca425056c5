"""Verification policies: when a finished step goes to the PRM and how the verify queue batches it
(docs/design.md, "Verification"). A preset names one by `SearchConfig.verification`: each class registers under
its name in `VERIFICATION` (`search/registry.py`). `Search` calls its hooks, with itself as a `SearchOps`
(`search/ops.py`), when a step finishes (`on_step_finished`) and when a round has finished generating
(`on_round_generated`); the runtime reads a class's `batching` to queue its steps.

- round: a request's whole round once it has finished generating, batched across requests (beam search);
- immediate: each step as soon as it finishes, batched across requests (speculative variants);
- lazy: each step as it finishes, held in the verifier's lazy queue until a lazy-verification trigger holds;
- lazy_round: a request's whole round once it has finished generating, held in the same lazy queue (an
  ablation, in no preset). A finished round is a set of complete sibling groups, so with the sibling-group
  trigger (docs/design.md, "Verification") it flushes at once; with `SearchConfig.lv_sibling_trigger = False`
  whole rounds wait for the token, deferral or age trigger (cross-request batching of rounds);
- per_request: a request's whole round (with its LookAhead continuations), one request per PRM call (FastTTS);
- lock_step: a request's whole round, held until every request in flight has generated its round, then all of
  them in one PRM call (search-and-learn's batched loop, `beam-sync`: docs/design.md, "The lock-step baseline");
  the runtime admits such requests in waves.
"""

from __future__ import annotations

from enum import Enum
from typing import ClassVar

from specscale.config import SearchConfig
from specscale.search.ops import SearchOps
from specscale.search.protocol import Action
from specscale.search.registry import Registry
from specscale.search.tree import Candidate, Round


class BatchMode(Enum):
    """How the runtime's verify queue batches a policy's steps (`runtime/verify_queue.py` carries each out)."""

    AT_ONCE = "at_once"  # ready at once, batched across requests
    LAZY = "lazy"  # held in the lazy queue until a lazy-verification trigger holds
    ONE_REQUEST = "one_request"  # ready at once, one request per PRM call (FastTTS)
    LOCK_STEP = "lock_step"  # held until the generator has nothing else to run: every in-flight round at once


AT_ONCE, LAZY, ONE_REQUEST, LOCK_STEP = BatchMode.AT_ONCE, BatchMode.LAZY, BatchMode.ONE_REQUEST, BatchMode.LOCK_STEP


VERIFICATION: Registry[Verification] = Registry("verification")


class Verification:
    """A verification policy: when a finished step goes to the PRM (`per_step`) and how the runtime's verify
    queue batches it (`batching`). Each hook takes the calling search (`search/ops.py`)."""

    per_step: ClassVar[bool]  # True: a step is sent as it finishes; False: a round at once, once it has generated
    batching: ClassVar[BatchMode]  # how `runtime/verify_queue.py` batches this policy's steps

    def __init__(self, config: SearchConfig):
        self.config = config

    def on_step_finished(self, search: SearchOps, c: Candidate) -> list[Action]:
        """A step finished as candidate c: a per-step policy sends it now (saying whether its sibling group
        is complete, lazy verification's trigger 2)."""
        if not self.per_step:
            return []
        return [search.verify(c, completes_group=search.group_complete(c.expansion))]

    def on_round_generated(self, search: SearchOps, rd: Round) -> list[Action]:
        """Round rd has finished generating: a round-at-once policy sends it once it is the round being decided."""
        if self.per_step or rd.index != search.last_decided + 1:
            return []
        return search.verify_round(rd)


@VERIFICATION.register("round")
class RoundVerification(Verification):
    per_step, batching = False, AT_ONCE


@VERIFICATION.register("immediate")
class ImmediateVerification(Verification):
    per_step, batching = True, AT_ONCE


@VERIFICATION.register("lazy")
class LazyVerification(Verification):
    per_step, batching = True, LAZY


@VERIFICATION.register("lazy_round")
class LazyRoundVerification(Verification):
    per_step, batching = False, LAZY


@VERIFICATION.register("per_request")
class PerRequestVerification(Verification):
    per_step, batching = False, ONE_REQUEST


@VERIFICATION.register("lock_step")
class LockStepVerification(Verification):
    per_step, batching = False, LOCK_STEP
