"""`python -m specscale_lab.train toy` writes where it is told (issue 45): a new runs/toy-<date>-<time> folder
by default, never the bundled models unless `--out specscale/assets` names them."""

from __future__ import annotations

from pathlib import Path

from specscale_lab.train import __main__ as train_command


def trained_into(monkeypatch, argv: list[str]) -> Path:
    written = []
    monkeypatch.setattr(train_command, "train_toy", lambda out, *args, **kwargs: written.append(out))
    assert train_command.main(argv) == 0
    return written[0]


def test_by_default_the_toy_models_go_to_a_new_run_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    out = trained_into(monkeypatch, ["toy", "--smoke"])
    assert out.parent == Path("runs") and out.name.startswith("toy-")
    assert f"--generator {out}/toy-generator --prm {out}/toy-prm" in capsys.readouterr().out


def test_the_bundled_models_are_replaced_only_when_named(monkeypatch):
    assert trained_into(monkeypatch, ["toy", "--out", "specscale/assets"]) == Path("specscale/assets")


def test_an_interrupted_training_ends_in_one_line(monkeypatch, capsys):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(train_command, "train_toy", interrupted)
    assert train_command.main(["toy", "--out", "unused"]) == 130
    assert capsys.readouterr().err.strip() == "python -m specscale_lab.train toy: interrupted"
