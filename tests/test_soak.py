"""The soak benchmark (benchmarks/soak.py) in CI: a minute of its mixed load on `specscale serve` with tiny
random checkpoints (a generator that never ends a path early, with a 4096-token context: a search a client
disconnects from at its first progress event has hundreds of rounds left, so it is still running however far
the server runs ahead of its client on a loaded machine). It must pass its own criteria — generator KV back at
its idle baseline at every drain, descriptors and threads flat, no 5xx, every request accounted for with the
client's counts equal to the server's `specscale_requests_total` exactly — except the RSS slope, which a run
this short cannot measure. Every kind of client ran. No speed threshold: a slow machine only sends fewer."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from checkpoints import build_qwen_prm_checkpoint, build_stepping_generator

ROOT = Path(__file__).resolve().parent.parent


def test_a_short_soak_leaks_nothing_and_accounts_for_every_request(tmp_path):
    generator = build_stepping_generator(tmp_path / "gen", eos_rate=0.0)
    config = json.loads((generator / "config.json").read_text())
    (generator / "config.json").write_text(json.dumps(config | {"max_position_embeddings": 4096}))
    prm = build_qwen_prm_checkpoint(tmp_path / "prm")
    out = tmp_path / "soak"
    command = [sys.executable, str(ROOT / "benchmarks" / "soak.py"), "--minutes", "1", "--rate", "2",
               "--sample-s", "10", "--drain-every-s", "20", "--no-rss-criterion", "--threads", "1",
               "--generator", str(generator), "--prm", str(prm), "--out", str(out),
               "--serve-arg=--generator-kv-gb=0.1", "--serve-arg=--prm-kv-gb=0.1",
               "--serve-arg=--lv-threshold-tokens=256", "--serve-arg=--max-concurrency=8"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=480, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    report = json.loads((out / "soak.json").read_text())
    checks = report["verdict"]["checks"]
    assert checks.pop("rss_growth_below_2pct_per_hour") is None  # not judged on a run this short
    assert all(checks.values()), checks
    assert len(report["drains"]) >= 3 and report["server_exit_code"] == 0
    records = json.loads((out / "raw.json").read_text())["records"]
    assert len(records) == report["sent"] and report["client_5xx"] == 0
    kinds = {r["kind"] for r in records}
    assert {"normal", "disconnect", "slow_reader", "slow_sender"} <= kinds
    assert sum(kind.startswith("hostile:") for kind in kinds) == 5
    outcomes = {(r["kind"], r["outcome"]) for r in records}
    assert ("disconnect", "cancelled") in outcomes and ("hostile:malformed_json", "refused") in outcomes
    assert (out / "soak.png").stat().st_size > 0 and "| verdict | PASS" in (out / "soak.md").read_text()


def test_the_memory_probe_runs_both_modes_and_padding_bounds_the_row_counts(tmp_path):
    """`--memory-probe` (no server): random row counts through one oneDNN linear, unpadded then padded, each in
    a fresh process. No RSS threshold here (a few hundred steps move RSS by little): only that both ran and that
    padding runs far fewer distinct row counts."""
    command = [sys.executable, str(ROOT / "benchmarks" / "soak.py"), "--memory-probe", "--memory-probe-steps", "200",
               "--threads", "1", "--out", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    runs = json.loads((tmp_path / "memory_probe.json").read_text())["runs"]
    if "skipped" in runs["unpadded"]:
        return  # oneDNN runs no bf16 linear on this CPU
    assert runs["padded"]["distinct_row_counts_run"] <= 80 < runs["unpadded"]["distinct_row_counts_run"]
    assert len(runs["padded"]["rss_mib_by_step"]) == len(runs["unpadded"]["rss_mib_by_step"]) == 11
