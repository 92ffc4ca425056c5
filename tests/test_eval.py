"""`specscale eval` end to end on the bundled toy models and MATH-500's first problems (the toy models
score ~0 there; what is tested is the real path): records as searches finish, an interrupted run
resumed without losing or repeating a search, the final table; plus its pieces (results folder,
progress lines)."""

import io
import json

import pytest

from specscale.cli import main
from specscale.grading import load_problems
from specscale_lab.evaluation import results as results_module
from specscale_lab.evaluation.progress import Progress, format_duration
from specscale_lab.evaluation.report import markdown, summarize
from specscale_lab.evaluation.results import ResultsFolder, read_jsonl

SMALL = ["--dataset", "math500", "--problems", "3", "--beam-size", "2", "--beam-width", "2", "--max-rounds", "2",
         "--max-step-tokens", "24", "--preset", "beam", "--threads", "1", "--kv-gb", "0.2", "--prm-kv-gb", "0.2"]


def test_eval_runs_resumes_after_an_interruption_and_reports(tmp_path, monkeypatch, capsys):
    out = tmp_path / "eval"
    command = ["eval", *SMALL, "--out", str(out)]
    original = ResultsFolder.add_record

    def interrupt_after_one(self, record):  # Ctrl-C right after the first search is on disk
        original(self, record)
        raise KeyboardInterrupt

    monkeypatch.setattr(ResultsFolder, "add_record", interrupt_after_one)
    assert main(command) == 130  # the searches in flight are cancelled, their KV freed (conftest checks)
    assert "run the same command again to resume" in capsys.readouterr().err
    first = read_jsonl(out / "records.jsonl")
    assert len(first) == 1 and not (out / "summary.json").exists()
    monkeypatch.setattr(ResultsFolder, "add_record", original)
    with (out / "records.jsonl").open("a") as file:
        file.write('{"dataset": "math500", "problem_id": "test/alg')  # a write torn by a crash

    assert main(command) == 0
    records = read_jsonl(out / "records.jsonl")
    problems = load_problems("math500", 3)
    assert sorted(r["problem_id"] for r in records) == sorted(p.problem_id for p in problems)
    assert records[0] == first[0]  # kept, not redone
    for record in records:
        problem = problems[record["problem_index"]]
        assert (record["preset"], record["seed"], record["dataset"]) == ("beam", 0, "math500")
        assert record["problem_id"] == problem.problem_id and record["gold"] == problem.gold
        assert set(record["correct"]) == {"best", "weighted_vote", "majority_vote"}
        assert record["correct"]["best"] is False or record["answer"] is not None
        assert record["tokens"]["output_tokens"] > 0 and record["timings"]["total_s"] > 0
        assert record["paths"] and record["best_text"] is not None and record["rounds"] >= 1
    assert [b["searches"] for b in read_jsonl(out / "batches.jsonl")] == [2]  # the interrupted batch wrote none
    summary = json.loads((out / "summary.json").read_text())
    beam = summary["results"]["beam"]
    assert beam["searches"] == 3 and 0 <= beam["accuracy"]["best"]["mean"] <= 1
    assert beam["output_tokens_per_s"] > 0
    assert summary["run"]["command"].startswith("specscale eval ") and summary["settings"]["beam_size"] == 2
    assert "| beam | 3 |" in (out / "eval.md").read_text()

    assert main(command) == 0  # nothing left to do: no model is loaded, the table is rewritten
    assert len(read_jsonl(out / "records.jsonl")) == 3

    with pytest.raises(SystemExit, match="other settings"):
        main(["eval", *SMALL, "--out", str(out), "--temperature", "0.5"])


def test_summary_pairs_presets_by_problem_and_seed():
    problems = load_problems("gsm8k", 4)
    correct = {"beam": [[1, 0, 1, 0], [1, 1, 0, 0]], "specscale": [[1, 0, 1, 1], [1, 1, 0, 1]]}  # [seed][problem]
    records = [{"preset": preset, "seed": seed, "problem_id": p.problem_id, "answer": "1", "error": None,
                "correct": {"best": bool(row[i]), "weighted_vote": bool(row[i]), "majority_vote": False},
                "tokens": {"output_tokens": 10, "generated_tokens": 20}, "timings": {"total_s": 1.0}}
               for preset, rows in correct.items() for seed, row in enumerate(rows) for i, p in enumerate(problems)]
    batches = [{"preset": preset, "seed": seed, "elapsed_s": 2.0, "output_tokens": 40, "generated_tokens": 80}
               for preset in correct for seed in (0, 1)]
    summary = summarize(records, batches, problems, ["beam", "specscale"], [0, 1])
    assert summary["beam"]["accuracy"]["best"]["mean"] == 0.5 and summary["specscale"]["searches"] == 8
    difference = summary["specscale"]["difference_to_beam"]["best"]
    assert difference["mean"] == 0.25 and difference["problems"] == 4 and difference["seeds"] == 2
    assert difference["ci95_low"] < 0.25 < difference["ci95_high"]
    assert summary["beam"]["output_tokens_per_s"] == 20.0
    table = markdown(summary, "beam")
    assert "| specscale | 8 | 75.0 | [46.7, 100.0] | 75.0 | 0.00 | +25.0 | [-24.0, +74.0] | 20.0 |" in table


def test_eval_refuses_bad_arguments_in_one_line(tmp_path, capsys):
    for options, expected in ((["--preset", "beam,nope"], "unknown preset(s) nope"),
                              (["--beam-size", "6", "--beam-width", "4"], "multiple of beam_width"),
                              (["--problems", "0"], "must be >= 1")):
        assert main(["eval", "--dataset", "gsm8k", *options, "--out", str(tmp_path)]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("specscale eval: error: ") and expected in lines[0], lines
    with pytest.raises(SystemExit):
        main(["eval", "--dataset", "math", "--out", str(tmp_path)])


def test_results_folder_drops_a_torn_line_and_keeps_settings(tmp_path):
    folder = ResultsFolder(tmp_path, {"beam_size": 8})
    folder.add_record({"preset": "beam", "seed": 0, "problem_id": "a"})
    with (tmp_path / results_module.RECORDS).open("a") as file:
        file.write('{"preset": "beam", "se')
    again = ResultsFolder(tmp_path, {"beam_size": 8})
    assert again.done() == {("beam", 0, "a")}
    assert (tmp_path / results_module.RECORDS).read_text().endswith("}\n")  # appends stay line-aligned
    again.add_record({"preset": "beam", "seed": 1, "problem_id": "a"})
    assert len(read_jsonl(tmp_path / results_module.RECORDS)) == 2
    with pytest.raises(SystemExit, match="other settings"):
        ResultsFolder(tmp_path, {"beam_size": 4})
    (tmp_path / results_module.RECORDS).write_text('{"preset": "beam"}\nnot json\n{"a": 1}\n')
    with pytest.raises(SystemExit, match="records.jsonl:2"):
        ResultsFolder(tmp_path, {"beam_size": 8})


def test_progress_prints_plain_lines_with_an_eta_off_a_terminal():
    stream = io.StringIO()
    now = [0.0]
    with Progress(40, "eval", stream=stream, clock=lambda: now[0]) as progress:
        progress.note("beam seed 0")
        for _ in range(40):
            now[0] += 3.0
            progress.update(1)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 20  # every 5% of the work
    assert lines[0] == "eval: 2/40 (5%) beam seed 0  elapsed 0m06s, ETA 1m54s"
    assert lines[-1].startswith("eval: 40/40 (100%)") and lines[-1].endswith("ETA 0m00s")
    assert format_duration(3 * 3600 + 5 * 60) == "3h05m" and format_duration(float("nan")) == "?"
