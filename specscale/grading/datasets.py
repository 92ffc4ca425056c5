"""The bundled evaluation sets (`specscale/data`): each record's question, gold answer and problem id.

Gold answers follow Qwen2.5-Math's evaluation conventions: MATH-500 the record's `answer`; GSM8K the
text after ``####`` (thousands separators removed); OlympiadBench ``final_answer[0]`` without its
``$`` signs. Problems keep their index in the file, which seeds their sampling, so a problem gets
the same seed whichever subset of the file a run takes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent.parent / "data"


@dataclass(frozen=True)
class Problem:
    dataset: str
    index: int  # line in the data set's file (0-based)
    problem_id: str  # stable across versions of this code: the data set's own id where it has one
    question: str
    gold: str


@dataclass(frozen=True)
class DatasetFormat:
    """How one data set's records read: question field, gold answer, problem id."""

    name: str
    question_field: str
    gold: Callable[[dict], str]
    problem_id: Callable[[dict, int], str]

    @property
    def path(self) -> Path:
        return DATA_DIR / self.name / "test.jsonl"


def gsm8k_gold(record: dict) -> str:
    return record["answer"].split("####")[-1].strip().replace(",", "")


def olympiadbench_gold(record: dict) -> str:
    """final_answer[0] without `$`: around it (Qwen2.5-Math's rule) and between the parts of 21 multi-part
    answers (``69$,$84``, ``f(n)=n$, $g(n)=1``), which would otherwise break the expression apart."""
    return record["final_answer"][0].replace("$", "").strip()


DATASETS: dict[str, DatasetFormat] = {d.name: d for d in (
    DatasetFormat("math500", "problem", lambda r: r["answer"], lambda r, i: r["unique_id"]),
    DatasetFormat("gsm8k", "question", gsm8k_gold, lambda r, i: f"gsm8k/test/{i}"),
    DatasetFormat("olympiadbench", "question", olympiadbench_gold, lambda r, i: f"olympiadbench/{r['id']}"),
)}


def load_problems(name: str, count: int | None = None) -> list[Problem]:
    """The first `count` problems of a bundled data set (all of them for None), in file order."""
    if name not in DATASETS:
        raise ValueError(f"unknown data set {name!r}; choose one of {sorted(DATASETS)}")
    if count is not None and count < 1:
        raise ValueError(f"the number of problems must be >= 1, got {count}")
    dataset = DATASETS[name]
    problems = []
    with dataset.path.open(encoding="utf-8") as lines:
        for index, line in enumerate(lines):
            if count is not None and index >= count:
                break
            record = json.loads(line)
            problems.append(Problem(name, index, dataset.problem_id(record, index),
                                    record[dataset.question_field], dataset.gold(record)))
    return problems
