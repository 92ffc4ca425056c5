"""ScoredPrefixes: a generator replica's picture of what the remote PRM has cached, so that its lazy
verification counts PRM tokens without a round trip per step (docs/scale-out.md, "Co-located vs
disaggregated").

A co-located verifier answers `tokens_to_compute` from its step-boundary cache (verify/prm.py): a path
costs its PRM input minus the longest cached step prefix. A remote one mirrors that cache's inserts: after
each scored path it records the path's last step boundary (the same chained key, `boundary_keys`) and its
length, LRU-bounded like the PRM's cache. The PRM replica may have evicted an entry, or hold one another
generator replica put there, so this is an estimate: it decides only when lazy verification flushes,
never a score.
"""

from __future__ import annotations

from collections import OrderedDict

from specscale.seam import ScoreRequest
from specscale.verify.formats import PRMFormat, PRMInput, clean_steps
from specscale.verify.prm import boundary_keys


def fitting_input(prm_format: PRMFormat, max_input_tokens: int, request: ScoreRequest) -> PRMInput | None:
    """The PRM input of the request's steps that fit the PRM's context (None: no step to score)."""
    steps = clean_steps(request.steps)
    if not steps:
        return None
    full = prm_format.encode(request.question, steps)
    fitting = sum(end <= max_input_tokens for end in full.step_ends)
    return full.first_steps(fitting) if fitting else None


class ScoredPrefixes:
    def __init__(self, max_entries: int):
        self.max_entries = max_entries
        self.lengths: OrderedDict[int, int] = OrderedDict()  # boundary key -> PRM tokens up to it, LRU first

    def __len__(self) -> int:
        return len(self.lengths)

    def tokens_to_compute(self, prm_input: PRMInput) -> int:
        """The input's tokens past its longest recorded step boundary."""
        for key in reversed(boundary_keys(prm_input)):
            if key in self.lengths:
                return len(prm_input.token_ids) - self.lengths[key]
        return len(prm_input.token_ids)

    def record(self, prm_input: PRMInput) -> None:
        """The PRM scored this input: it caches the prefix up to its last boundary."""
        key = boundary_keys(prm_input)[-1]
        self.lengths[key] = len(prm_input.token_ids)
        self.lengths.move_to_end(key)
        while len(self.lengths) > self.max_entries:
            self.lengths.popitem(last=False)
