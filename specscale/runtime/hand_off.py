"""HandOff: finished searches to their callers (docs/architecture.md, step 10).

Each decided round goes to `on_round`; a finished search's result gets its answers and votes (the
`read_answers` callback, `specscale/answers.py`: `search/` never imports `grading/`), its usage and timings,
and goes to `on_finished`, to the tick that finished it, and (keep_finished runtimes) to `result` / `search`.
"""

from __future__ import annotations

from collections.abc import Callable

from specscale.runtime.request_state import RequestState, timings_of, usage_of
from specscale.search.result import AnswerReader, SearchResult


class HandOff:
    def __init__(self, clock: Callable[[], float], keep_finished: bool, on_finished: Callable | None,
                 on_round: Callable | None, read_answers: AnswerReader | None):
        self.clock = clock
        self.finished: dict[str, RequestState] = {}
        self._this_tick: list[RequestState] = []  # finished during the tick in progress
        self._keep_finished = keep_finished
        self._on_finished = on_finished
        self._on_round = on_round
        self._read_answers = read_answers

    def report_rounds(self, state: RequestState) -> None:
        """The search's decided rounds not reported yet go to on_round."""
        decisions = state.search.decisions
        while state.rounds_reported < len(decisions):
            if self._on_round is not None:
                self._on_round(state.request_id, decisions[state.rounds_reported])
            state.rounds_reported += 1

    def write_result(self, state: RequestState) -> None:
        """The finished search's result, with its answers, usage and timings."""
        state.result = state.search.result
        if self._read_answers is not None:
            self._read_answers(state.result)
        state.result.usage = usage_of(state)
        state.result.timings = timings_of(state, self.clock())

    def deliver(self, state: RequestState, notify: bool) -> None:
        """Hand the result out: kept, returned by the tick, and to on_finished unless notify is False."""
        if self._keep_finished:
            self.finished[state.request_id] = state
        self._this_tick.append(state)
        if notify and self._on_finished is not None:
            self._on_finished(state.request_id, state.result)

    def start_tick(self) -> None:
        """A tick returns the searches it finished; those cancelled between ticks went to on_finished only."""
        self._this_tick = []

    def take_tick(self) -> list[tuple[str, SearchResult]]:
        """The searches this tick finished, with their results."""
        done, self._this_tick = self._this_tick, []
        return [(s.request_id, s.result) for s in done]
