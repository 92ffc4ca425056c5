"""A path to score and its step scores: what a verifier backend takes and gives back (`verify/prm.py`
`Verifier`, `scaleout/remote_verifier.py` `RemoteVerifier`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ScoreRequest:
    """One path to score: its question and its steps so far (each may end with the "\\n\\n" delimiter)."""

    question: str
    steps: tuple[str, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "steps", tuple(self.steps))


@dataclass(frozen=True)
class ScoreResult:
    """Scores of one path: step_scores[j] for the j-th non-empty step, in order.

    num_steps: the path's non-empty steps. error: why not every step was scored (step_scores then holds
    the steps that were). exceeds_context: that reason is the PRM's context (verify/prm.py, "Context").
    computed_tokens: PRM tokens run for this path in this call (0 when its scores came from the cache or
    from an identical path of the same batch).
    """

    step_scores: tuple[float, ...]
    num_steps: int
    error: str | None = None
    computed_tokens: int = 0
    exceeds_context: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def newest_score(self) -> float | None:
        """The last step's score; None unless every step was scored."""
        if self.error is not None or not self.step_scores:
            return None
        return self.step_scores[-1]
