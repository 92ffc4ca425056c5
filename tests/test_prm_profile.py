"""PRM throughput profiler: the knee rule, `specscale profile-prm` end to end on a tiny random-weight PRM
(table, JSON, PNG), the threshold file the search reads, and the error without a model."""

import json

import pytest

import specscale.defaults
from checkpoints import build_qwen_prm_checkpoint
from specscale.cli import main
from specscale.verify.profile import (
    QUICK_BATCH_TOKENS,
    PRMProfile,
    ProfilePoint,
    default_profile_path,
    knee,
    load_lv_threshold,
    sequence_sizes,
)


@pytest.fixture(scope="module")
def tiny_prm(tmp_path_factory):
    return build_qwen_prm_checkpoint(tmp_path_factory.mktemp("profile_prm"))


def point(batch_tokens: int, tokens_per_s: float) -> ProfilePoint:
    median = batch_tokens / tokens_per_s
    return ProfilePoint(batch_tokens, (median * 1.1, median, median * 0.9))


def test_knee_is_the_smallest_batch_within_90_percent_of_peak():
    points = [point(256, 100), point(512, 180), point(1024, 300), point(2048, 330), point(4096, 335), point(8192, 320)]
    assert points[2].tokens_per_s == pytest.approx(300)
    assert knee(points) == 2048  # 300 < 0.9 * 335 <= 330
    assert knee(points, fraction=0.8) == 1024
    assert knee([point(256, 50), point(512, 40)]) == 256  # saturated from the start


def test_batches_are_split_into_step_sized_sequences():
    assert sequence_sizes(256, 128) == [128, 128]
    assert sequence_sizes(300, 128) == [128, 128, 44]
    assert sequence_sizes(16, 128) == [16]


def test_profile_prm_command_writes_table_json_and_plot(tiny_prm, tmp_path, capsys):
    out, plot = tmp_path / "profile.json", tmp_path / "profile.png"
    assert main(["profile-prm", "--model", str(tiny_prm), "--out", str(out), "--plot", str(plot), "--quick",
                 "--dtype", "float32", "--device", "cpu"]) == 0
    data = json.loads(out.read_text())
    profile = PRMProfile.from_json(data)
    assert [p.batch_tokens for p in profile.points] == list(QUICK_BATCH_TOKENS)
    assert all(len(p.seconds) == 2 and min(p.seconds) > 0 for p in profile.points)
    assert profile.threshold == knee(profile.points) and data["device"] == "cpu" and data["dtype"] == "float32"
    assert data["model"] == str(tiny_prm.resolve())
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    printed = capsys.readouterr().out
    assert "<- knee" in printed and f"threshold: {profile.threshold} tokens" in printed
    for p in profile.points:
        assert f"{p.batch_tokens:>12}" in printed


def test_default_location_is_what_the_search_reads(tiny_prm, tmp_path, monkeypatch):
    monkeypatch.delenv("SPECSCALE_PRM_PROFILE_DIR")  # the tests' own folder (conftest.py): the default here
    monkeypatch.setenv("SPECSCALE_CACHE_DIR", str(tmp_path / "cache"))
    assert load_lv_threshold(tiny_prm, "cpu") is None  # never profiled
    assert main(["profile-prm", "--model", str(tiny_prm), "--quick", "--dtype", "float32", "--device", "cpu"]) == 0
    path = default_profile_path(tiny_prm, "cpu")
    assert path.is_file() and path.with_suffix(".png").is_file()
    assert str(path).startswith(str(tmp_path / "cache"))
    threshold = json.loads(path.read_text())["threshold"]
    assert threshold in QUICK_BATCH_TOKENS
    assert load_lv_threshold(tiny_prm, "cpu") == threshold
    assert load_lv_threshold(tmp_path / "another-model", "cpu") is None
    path.write_text("{not json")
    assert load_lv_threshold(tiny_prm, "cpu") is None


def test_without_a_model_or_bundled_toy_prm_it_says_to_pass_one(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(specscale.defaults, "TOY_PRM", tmp_path / "missing-toy-prm")
    assert main(["profile-prm", "--quick"]) == 2
    assert "pass --model" in capsys.readouterr().err
