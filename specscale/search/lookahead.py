"""FastTTS's Speculative Beam Extension (LookAhead) as one policy (docs/design.md, "FastTTS").

A step that finished while its round is still generating keeps decoding its next step (sampled as the step
was, as FastTTS's engine does) at the lowest priority, paused when the round ends and scored with the round
if it finished. When its parent is retained the continuation becomes a child, and every other child starts
from its text, truncated (`lookahead_head_start`); a per-request valve (`max_live_sequences`) force-finishes
the oldest continuations. Branching on LookAhead scores (`branching_score="lookahead"`) waits for the
continuations' scores of the round's PRM call.

The switch `SearchConfig.lookahead` chooses the class registered in `LOOKAHEAD` (`search/registry.py`) as "on"
(`LookAhead`) or "off" (`NoLookahead`, whose hooks do nothing). `Search` calls its hooks, with itself as a
`SearchOps` (`search/ops.py`), and never asks what a continuation is:

- `on_step_finished(search, c, time)`: a step finished (LookAhead: start its continuation);
- `on_round_generated(search, rd)`: round rd's real work has generated (pause its continuations);
- `verified_with_round(search, rd)`: what round-at-once verification scores with round rd;
- `awaiting_scores(search, rd)`: whether round rd must still wait for scores before it is decided;
- `round_work(e)`: whether expansion e is its round's real work (a continuation is not: the round is generated,
  a sibling group complete, without it); `priority(e)`: the engine priority of an expansion that is not;
- `on_child_kept(e)`: a retained parent keeps child e (a continuation becomes a real child);
- `on_children_started(parent, new)`: the retained parent's missing children were started; what each starts
  from (`Expansion.start_from`: a share of the continuation's tokens, drawn here from the child's seed; the
  runtime only cuts them, `protocol.StartFrom`).
"""

from __future__ import annotations

import random

from specscale.config import SearchConfig
from specscale.search.ops import SearchOps
from specscale.search.protocol import Action, Pause, Resume, StartFrom
from specscale.search.registry import OFF, ON, Registry
from specscale.search.tree import Candidate, CandidateState, Expansion, Round
from specscale.search.verification import VERIFICATION

# Engine priority of a LookAhead continuation: below every speculation band (search/speculation.py)
LOOKAHEAD_PRIORITY = -100 * 100

LOOKAHEAD: Registry[NoLookahead] = Registry("lookahead", switch=True)


@LOOKAHEAD.register(OFF)
class NoLookahead:
    """Every variant but FastTTS's: no continuations, every expansion is its round's real work."""

    def __init__(self, config: SearchConfig):
        self.config = config

    def on_step_finished(self, search: SearchOps, c: Candidate, time: float) -> list[Action]:
        return []

    def on_round_generated(self, search: SearchOps, rd: Round) -> list[Action]:
        return []

    def verified_with_round(self, search: SearchOps, rd: Round) -> list[Candidate]:
        return []

    def awaiting_scores(self, search: SearchOps, rd: Round) -> bool:
        return False

    def round_work(self, e: Expansion) -> bool:
        """Whether e is its round's real work: its round has generated, its group finished, only when e has."""
        return True

    def priority(self, e: Expansion) -> int:
        """The engine priority of an expansion that is not round work (`round_work`)."""
        return 0

    def on_child_kept(self, e: Expansion) -> list[Action]:
        """A retained parent keeps its child e (its lanes already cut to the wanted ones)."""
        return []

    def on_children_started(self, parent: Candidate, new: list[Expansion]) -> None:
        """The retained parent's missing children were started as expansions `new` (not yet sent)."""


@LOOKAHEAD.register(ON)
class LookAhead(NoLookahead):
    def __init__(self, config: SearchConfig):
        super().__init__(config)
        self.cut: list[int] = []  # expansions force-finished by the valve, in order
        # branching on LookAhead scores waits for the continuations scored in the round's PRM call
        per_step = VERIFICATION.chosen(config).per_step
        self.waits_for_round_scores = config.branching_score == "lookahead" and not per_step

    def on_step_finished(self, search: SearchOps, c: Candidate, time: float) -> list[Action]:
        """A step finished: start its continuation if its path is certain to be in its round's pool."""
        certain = c.parent is None or c.parent.state == CandidateState.RETAINED
        if c.completed or not certain or c.round >= search.last_round:
            return []
        actions = self._make_room(search)
        e = search.new_expansion(c, c.round + 1, (c.key + (0,),), time, lookahead=True)
        e.started_as_lookahead = True
        return actions + [search.expand_action(e)]

    def _make_room(self, search: SearchOps) -> list[Action]:
        """FastTTS's valve, per request: running plus speculative beams stay below max_live_sequences; on
        overflow the oldest running lookaheads are force-finished (paused with their text so far, which
        still counts as the head start of their parent's children) rather than refusing the new one."""
        running = [e for e in search.expansions.values() if e.live and not e.paused]
        excess = sum(e.keep_left for e in running) + 1 - self.config.max_live_sequences
        oldest = sorted((e for e in running if e.lookahead), key=lambda e: e.id)
        cut = []
        for e in oldest:
            if excess <= 0:
                break
            e.paused = True
            cut.append(e.id)
            excess -= e.keep_left
        self.cut += cut
        return [Pause(tuple(cut))] if cut else []

    def on_round_generated(self, search: SearchOps, rd: Round) -> list[Action]:
        """The round's last real step finished: its candidates' continuations stop for now."""
        if rd.index + 1 >= len(search.rounds):
            return []
        running = [e for e in search.rounds[rd.index + 1].expansions if e.lookahead and e.live and not e.paused]
        for e in running:
            e.paused = True
        return [Pause(tuple(e.id for e in running))] if running else []

    def verified_with_round(self, search: SearchOps, rd: Round) -> list[Candidate]:
        """Finished continuations of the round's candidates, scored in the round's PRM call."""
        if rd.index + 1 >= len(search.rounds):
            return []
        ahead = search.rounds[rd.index + 1].candidates
        return [c for c in ahead if c.alive and c.verified_order is None and not c.verify_sent]

    def awaiting_scores(self, search: SearchOps, rd: Round) -> bool:
        """FastTTS branching on LookAhead scores (search/branching.py): the continuations verified in the
        round's PRM call have scores still to arrive (the same call's, a moment later)."""
        if not self.waits_for_round_scores or rd.index + 1 >= len(search.rounds):
            return False
        ahead = search.rounds[rd.index + 1].candidates
        return any(c.alive and c.verify_sent and c.state != CandidateState.SCORED
                   and c.expansion.started_as_lookahead for c in ahead)

    def round_work(self, e: Expansion) -> bool:
        """A continuation is not, until its parent is retained (`on_child_kept`)."""
        return not e.lookahead

    def priority(self, e: Expansion) -> int:
        """Continuations run below everything else."""
        return LOOKAHEAD_PRIORITY

    def on_child_kept(self, e: Expansion) -> list[Action]:
        """The retained parent's continuation becomes a real child (resumed if it was paused)."""
        return promote(e) if e.lookahead and not e.cancelled else []

    def on_children_started(self, parent: Candidate, new: list[Expansion]) -> None:
        """Every other child starts from the parent's kept continuation's text, truncated (`head_start_share`)."""
        source = next((e for e in parent.children if e.started_as_lookahead and not e.cancelled), None)
        if source is None:
            return
        for e in new:
            e.start_from = StartFrom(source.id, self.head_start_share(e))

    def head_start_share(self, e: Expansion) -> float:
        """FastTTS's truncation of a duplicate's head start: of the tokens the continuation has written so far,
        a child keeps a share r ~ Normal(lookahead_head_start, lookahead_head_start_std) clipped to [0, 1]
        (at least one token, and at least one token fewer than written: `StartFrom.prefix_of`;
        docs/design.md, "FastTTS"). r is drawn from the child's own seed (its expansion id when unseeded)."""
        draw = random.Random(e.seeds[0] if e.seeds else e.id)
        share = draw.gauss(self.config.lookahead_head_start, self.config.lookahead_head_start_std)
        return min(max(share, 0.0), 1.0)


def promote(e: Expansion) -> list[Action]:
    """A retained parent's continuation becomes a real child (resumed if it was paused)."""
    e.lookahead = False
    e.priority = 0
    if e.paused and e.live:
        e.paused = False
        return [Resume((e.id,), 0)]
    return []
