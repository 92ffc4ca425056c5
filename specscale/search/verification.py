"""Verification policies: when a finished step goes to the PRM and how the verify queue batches it
(docs/design.md, "Verification"). A preset names one by `SearchConfig.verification`.

- round: a request's whole round once it has finished generating, batched across requests (beam search);
- immediate: each step as soon as it finishes, batched across requests (speculative variants);
- lazy: each step as it finishes, held in the queue until a lazy-verification trigger of its request holds;
- per_request: a request's whole round (with its LookAhead continuations), one request per PRM call (FastTTS).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Verification:
    name: str
    per_step: bool  # True: a step is sent as it finishes; False: a round at once, when it has finished generating

    @property
    def queue_mode(self) -> str:
        """How `search/verify_queue.py` batches this policy's steps."""
        return self.name


VERIFICATIONS = {
    "round": Verification("round", per_step=False),
    "immediate": Verification("immediate", per_step=True),
    "lazy": Verification("lazy", per_step=True),
    "per_request": Verification("per_request", per_step=False),
}
