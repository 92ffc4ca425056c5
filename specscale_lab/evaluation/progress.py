"""Progress of a long run: a live bar with an ETA on a terminal, plain dated lines otherwise (logs, CI)."""

from __future__ import annotations

import sys
import time

from tqdm import tqdm

LINE_EVERY_S = 60.0  # a plain progress line at most this often...
LINE_EVERY_SHARE = 0.05  # ...or after this share of the work, whichever comes first


class Progress:
    """`update(n)` after n more items; `note(text)` names what runs now. A context manager."""

    def __init__(self, total: int, description: str, stream=None, clock=time.monotonic):
        self.total, self.description = total, description
        self.stream = stream or sys.stderr
        self.clock = clock
        self.done = 0
        self.started = self._last_line = clock()
        self._last_done = 0
        self._note = ""
        self.bar = tqdm(total=total, desc=description, unit="req", dynamic_ncols=True, file=self.stream) \
            if self.stream.isatty() else None

    def update(self, count: int) -> None:
        self.done += count
        if self.bar is not None:
            self.bar.update(count)
        elif self._line_due():
            self._print_line()

    def note(self, text: str) -> None:
        self._note = text
        if self.bar is not None:
            self.bar.set_postfix_str(text)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.done != self._last_done:
            self._print_line()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _line_due(self) -> bool:
        return (self.clock() - self._last_line >= LINE_EVERY_S or self.done == self.total
                or self.done - self._last_done >= max(1, round(self.total * LINE_EVERY_SHARE)))

    def _print_line(self) -> None:
        now = self.clock()
        elapsed = now - self.started
        eta = elapsed / self.done * (self.total - self.done) if self.done else float("nan")
        share = self.done / self.total if self.total else 1.0
        print(f"{self.description}: {self.done}/{self.total} ({share:.0%}) {self._note}  "
              f"elapsed {format_duration(elapsed)}, ETA {format_duration(eta)}", file=self.stream, flush=True)
        self._last_line, self._last_done = now, self.done


def format_duration(seconds: float) -> str:
    if seconds != seconds:  # NaN: no rate yet
        return "?"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"
