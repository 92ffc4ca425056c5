"""FastTTS's Speculative Beam Extension (LookAhead) as one speculation policy (docs/design.md, "FastTTS").

A step that finished while its round is still generating keeps decoding its next step (sampled as the step
was, as FastTTS's engine does) at the lowest priority, paused when the round ends and scored with the round
if it finished. When its parent is retained the continuation becomes a child, and every other child starts
from its text, truncated (`lookahead_head_start`); a per-request valve (`max_live_sequences`) force-finishes
the oldest continuations. Branching on LookAhead scores (`branching_score="lookahead"`) waits for the
continuations' scores of the round's PRM call.

`Search` calls the hooks of `make_lookahead(config)`: `NoLookahead` for every other variant, whose hooks
do nothing. The runtime's share of the policy is `head_start`, the truncated text a child starts from.
"""

from __future__ import annotations

import random

from specscale.config import SearchConfig
from specscale.search.protocol import Expand, Pause, Resume
from specscale.search.tree import Candidate, CandidateState, Expansion, Round

# Engine priority of a LookAhead continuation: below every speculation band (search/speculation.py)
LOOKAHEAD_PRIORITY = -100 * 100


class NoLookahead:
    """Every variant but FastTTS's: no continuations. Each hook takes the calling `Search` (its tree,
    rounds and expansion factory) as its first argument."""

    def on_step_finished(self, search, c: Candidate, time: float) -> list:
        return []

    def on_round_generated(self, search, rd: Round) -> list:
        return []

    def verified_with_round(self, search, rd: Round) -> list[Candidate]:
        return []

    def awaiting_scores(self, search, rd: Round) -> bool:
        return False


class LookAhead(NoLookahead):
    def on_step_finished(self, search, c: Candidate, time: float) -> list:
        """A step finished: start its continuation if its path is certain to be in its round's pool."""
        certain = c.parent is None or c.parent.state == CandidateState.RETAINED
        if c.completed or not certain or c.round >= search.last_round:
            return []
        actions = self._make_room(search)
        e = search._new_expansion(c, c.round + 1, (c.key + (0,),), time, lookahead=True)
        e.started_as_lookahead = True
        return actions + [Expand(*search._expand_fields(e))]

    def _make_room(self, search) -> list:
        """FastTTS's valve, per request: running plus speculative beams stay below max_live_sequences; on
        overflow the oldest running lookaheads are force-finished (paused with their text so far, which
        still counts as the head start of their parent's children) rather than refusing the new one."""
        running = [e for e in search.expansions.values() if e.live and not e.paused]
        excess = sum(e.keep_left for e in running) + 1 - search.config.max_live_sequences
        oldest = sorted((e for e in running if e.lookahead), key=lambda e: e.id)
        cut = []
        for e in oldest:
            if excess <= 0:
                break
            e.paused = True
            cut.append(e.id)
            excess -= e.keep_left
        search.lookaheads_cut += cut
        return [Pause(tuple(cut))] if cut else []

    def on_round_generated(self, search, rd: Round) -> list:
        """The round's last real step finished: its candidates' continuations stop for now."""
        if rd.index + 1 >= len(search.rounds):
            return []
        running = [e for e in search.rounds[rd.index + 1].expansions if e.lookahead and e.live and not e.paused]
        for e in running:
            e.paused = True
        return [Pause(tuple(e.id for e in running))] if running else []

    def verified_with_round(self, search, rd: Round) -> list[Candidate]:
        """Finished continuations of the round's candidates, scored in the round's PRM call."""
        if rd.index + 1 >= len(search.rounds):
            return []
        ahead = search.rounds[rd.index + 1].candidates
        return [c for c in ahead if c.alive and c.verified_order is None and not c.verify_sent]

    def awaiting_scores(self, search, rd: Round) -> bool:
        """FastTTS branching on LookAhead scores (search/branching.py): the continuations verified in the
        round's PRM call have scores still to arrive (the same call's, a moment later)."""
        lookahead_branching = search.config.branching_score == "lookahead"
        if not lookahead_branching or search.verification.per_step or rd.index + 1 >= len(search.rounds):
            return False
        ahead = search.rounds[rd.index + 1].candidates
        return any(c.alive and c.verify_sent and c.state != CandidateState.SCORED
                   and c.expansion.started_as_lookahead for c in ahead)


def promote(e: Expansion) -> list:
    """A retained parent's continuation becomes a real child (resumed if it was paused)."""
    e.lookahead = False
    e.priority = 0
    if e.paused and e.live:
        e.paused = False
        return [Resume((e.id,), 0)]
    return []


def make_lookahead(config: SearchConfig) -> NoLookahead:
    return LookAhead() if config.lookahead else NoLookahead()


def head_start(written: list[int], config: SearchConfig, seed: int) -> list[int]:
    """FastTTS's truncation of a duplicate's head start: of the tokens the continuation has written so far,
    keep a share r ~ Normal(lookahead_head_start, lookahead_head_start_std) clipped to [0, 1] -- at least
    one token, and at least one token fewer than written (docs/design.md, "Speculation"). r is drawn from
    the child's own seed."""
    draw = random.Random(seed)
    share = min(max(draw.gauss(config.lookahead_head_start, config.lookahead_head_start_std), 0.0), 1.0)
    return written[: min(max(int(share * len(written)), 1), len(written) - 1)]
