"""The results folder of `specscale eval`: what a run writes, and how a rerun resumes it.

- ``run.json``: the settings that give a record its meaning (data set, models, search size, sampling,
  system prompt), written with the first record. A rerun with other settings is refused, so one folder
  never mixes two setups; presets, seeds and the number of problems may change, and a rerun adds only what
  the folder lacks. A run that failed before its first record (a wrong model path) leaves no run.json to
  refuse the corrected command.
- ``records.jsonl``: one line per (preset, seed, problem), appended and flushed (fsync) as each search
  finishes, so a crash or Ctrl-C loses at most the searches in flight.
- ``batches.jsonl``: one line per completed batch (one preset and seed over the problems it still
  lacked): wall time and tokens, the basis of tokens/s. An interrupted batch writes none.
- ``summary.json`` and ``eval.md``: the final table, written when every search of the run is in.

A crash while a line is written leaves it torn; reading drops that last partial line (the file is
truncated to its last complete line), so the rerun simply redoes that search.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

RECORDS = "records.jsonl"
BATCHES = "batches.jsonl"
SETTINGS = "run.json"
SUMMARY = "summary.json"
REPORT = "eval.md"


class ResultsFolder:
    def __init__(self, path: str | Path, settings: dict):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.settings = settings
        self._check_settings(settings)
        self.records = read_jsonl(self.path / RECORDS)
        self.batches = read_jsonl(self.path / BATCHES)

    def done(self) -> set[tuple[str, int, str]]:
        """(preset, seed, problem id) of every search the folder holds."""
        return {record_key(r) for r in self.records}

    def add_record(self, record: dict) -> None:
        self._keep_settings()
        append_jsonl(self.path / RECORDS, record)
        self.records.append(record)

    def add_batch(self, batch: dict) -> None:
        self._keep_settings()
        append_jsonl(self.path / BATCHES, batch)
        self.batches.append(batch)

    def write_summary(self, summary: dict, markdown: str) -> None:
        (self.path / SUMMARY).write_text(json.dumps(summary, indent=2, default=str) + "\n")
        (self.path / REPORT).write_text(markdown)

    def _check_settings(self, settings: dict) -> None:
        file = self.path / SETTINGS
        if file.is_file():
            held = json.loads(file.read_text())
            changed = {key: {"held": held.get(key), "now": value} for key, value in settings.items()
                       if held.get(key) != value}
            if changed:
                raise SystemExit(f"{self.path} holds results of other settings ({json.dumps(changed)}); "
                                 "rerun with the same settings to resume, or pass another --out")

    def _keep_settings(self) -> None:
        """run.json, written before the folder's first result."""
        file = self.path / SETTINGS
        if not file.is_file():
            file.write_text(json.dumps(self.settings, indent=2) + "\n")


def record_key(record: dict) -> tuple[str, int, str]:
    return record["preset"], record["seed"], record["problem_id"]


def append_jsonl(path: Path, row: dict) -> None:
    """Append one JSON line and make it durable before returning."""
    with path.open("a", encoding="utf-8") as file:
        file.write(json.dumps(row, ensure_ascii=False) + "\n")
        file.flush()
        os.fsync(file.fileno())


def read_jsonl(path: Path) -> list[dict]:
    """Every complete line of a JSONL file (none if there is no file); a torn last line is cut off."""
    if not path.is_file():
        return []
    data = path.read_bytes()
    complete = data[: data.rfind(b"\n") + 1]
    if len(complete) < len(data):  # the last write never finished: drop it so appends stay line-aligned
        with path.open("r+b") as file:
            file.truncate(len(complete))
    rows = []
    for number, line in enumerate(complete.decode("utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as error:
            raise SystemExit(f"{path}:{number} is not a JSON line ({error}); fix or remove it to resume") from None
    return rows
