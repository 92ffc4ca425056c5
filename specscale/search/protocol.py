"""Events into a search and actions out of it. A search never calls a model or reads a clock.

Identities: an *expansion* (a parent path's request for m logical children, generated as one step)
and a *candidate* (a finished step) have ids chosen by the search. A *handle* is the runner's name
for the physical sequence holding a candidate's KV; the search only stores and returns it.
Times are given in events (seconds on the runner's clock, real or virtual).
"""

from __future__ import annotations

from dataclasses import dataclass


# ---- events -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StepFinished:
    """Physical sequence `handle` of expansion `expansion_id` finished one step.

    lanes: the expansion's logical children this finished step stands for (several with CD, else (0,)).
    completed: the path ended (EOS, step or context cap, or the last round); handle is then None.
    finish_reason: "stop" (a step delimiter or EOS ended it) or "length" (cut by the step's token cap
    or the context limit).
    """

    expansion_id: int
    handle: int | None
    text: str
    num_tokens: int
    lanes: tuple[int, ...]
    completed: bool
    time: float
    finish_reason: str = "stop"


@dataclass(frozen=True)
class GenerationLost:
    """A speculative sequence was aborted by the engine (preempted); its logical children (lanes) are gone."""

    expansion_id: int
    lanes: tuple[int, ...]
    time: float


@dataclass(frozen=True)
class StepPartial:
    """Sequence `handle` of expansion `expansion_id` is still writing its step and has written `num_tokens` of it
    (`text`), as many as the search's partial-rejection policy asked to watch for (docs/design.md,
    "Partial-step rejection"). lanes: the logical children the sequence holds now."""

    expansion_id: int
    handle: int
    text: str
    num_tokens: int
    lanes: tuple[int, ...]
    time: float


@dataclass(frozen=True)
class ScoresArrived:
    """PRM step scores for candidate id `candidate` (all steps of its path, in order)."""

    candidate: int
    step_scores: tuple[float, ...]
    error: str | None
    time: float


@dataclass(frozen=True)
class Cancelled:
    """The request was cancelled (client gone, timeout): release everything."""

    time: float


# ---- actions ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StartFrom:
    """Where a child starts: `share` (in [0, 1]) of the tokens expansion `expansion_id` of the same request has
    written so far, after its parent's, instead of at its parent's end (docs/design.md, "FastTTS")."""

    expansion_id: int
    share: float

    def prefix_of(self, written: list[int]) -> list[int]:
        """The tokens the child starts from: `share` of `written`, at least one, and at least one fewer."""
        return written[: min(max(int(self.share * len(written)), 1), len(written) - 1)]


@dataclass(frozen=True)
class Expand:
    """Start generating one step for `multiplicity` logical children of the candidate whose KV is
    held by parent_handle (None = the request's prompt).

    final_round: generate to EOS instead of stopping at the step delimiter.
    seeds: one sampling seed per logical child (search/seeds.py; None when the request is unseeded):
    a child samples from its own seed whether it is its own row or one lane of a CD row.
    lookahead: FastTTS speculative continuation of a step that just finished (lowest priority,
    aborted if preempted) rather than a normal child.
    start_from: None, or a share of the tokens another expansion has written so far, which this child starts
    from (FastTTS's head start, chosen by the lookahead policy; the runtime only cuts the tokens).
    """

    expansion_id: int
    parent_handle: int | None
    multiplicity: int
    priority: int
    final_round: bool
    seeds: tuple[int, ...] | None
    lookahead: bool = False
    start_from: StartFrom | None = None


@dataclass(frozen=True)
class Verify:
    """Score candidate id `candidate` (its path = steps). completes_group: this step completes its
    sibling group (a lazy-verification flush trigger). partial: a partial-step readout (partial rejection,
    `candidate` being the readout's id): it rides along with PRM batches that run anyway and triggers none."""

    candidate: int
    steps: tuple[str, ...]
    completes_group: bool
    partial: bool = False


@dataclass(frozen=True)
class Cancel:
    """Stop and free: expansions still generating, and the paused sequences of these handles.
    candidates: ids of the dropped candidates (their queued verifications are dropped too)."""

    expansions: tuple[int, ...] = ()
    handles: tuple[int, ...] = ()
    candidates: tuple[int, ...] = ()


@dataclass(frozen=True)
class Release:
    """Free paused sequences that are no longer needed (their children share the KV)."""

    handles: tuple[int, ...]


@dataclass(frozen=True)
class SetPriority:
    expansions: tuple[int, ...]
    priority: int


@dataclass(frozen=True)
class Pause:
    """Stop generating these (FastTTS lookahead) expansions for now; their text so far is kept."""

    expansions: tuple[int, ...]


@dataclass(frozen=True)
class Resume:
    """Continue paused lookahead expansions as real children."""

    expansions: tuple[int, ...]
    priority: int


@dataclass(frozen=True)
class Done:
    """The search has finished; its result is on the search object."""


Action = Expand | Verify | Cancel | Release | SetPriority | Pause | Resume | Done
Event = StepFinished | StepPartial | GenerationLost | ScoresArrived | Cancelled
