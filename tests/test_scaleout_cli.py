"""`specscale serve --ray` as a user runs it: a subprocess that starts its own local Ray instance, prints
where it serves once its replica is up, answers the OpenAI API, and on SIGTERM removes its application and
stops the Ray instance it started (exit 0, "SpecScale stopped"). Tiny random checkpoints, one replica."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
from checkpoints import build_qwen_prm_checkpoint, build_stepping_generator


def test_serve_ray_serves_and_stops_cleanly_on_sigterm(tmp_path):
    generator = build_stepping_generator(tmp_path / "gen", eos_rate=0.0)
    prm = build_qwen_prm_checkpoint(tmp_path / "prm")
    log = tmp_path / "serve.log"
    command = [sys.executable, "-m", "specscale.cli", "serve", "--ray", "--replicas", "1", "--replica-cpus", "0.5",
               "--threads", "1", "--port", "0", "--generator", str(generator), "--prm", str(prm),
               "--served-model-name", "tiny", "--generator-kv-gb", "0.1", "--prm-kv-gb", "0.1",
               "--lv-threshold-tokens", "256", "--log-level", "warning"]
    with open(log, "w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=Path(__file__).parent.parent)
    try:
        url = _wait_for_url(log, process)
        body = {"model": "tiny", "messages": [{"role": "user", "content": "Tom has 12 apples."}], "max_tokens": 16,
                "seed": 1, "search": {"beam_size": 4, "beam_width": 2, "max_rounds": 3}}
        answer = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
        assert answer.status_code == 200 and answer.json()["choices"][0]["message"]["content"]
        assert httpx.get(f"{url}/health", timeout=30).json()["replicas_healthy"] == 1
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            code = process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            code = "killed"
    assert code == 0 and "SpecScale stopped" in log.read_text(), f"exit {code}:\n{log.read_text()[-3000:]}"


def _wait_for_url(log: Path, process: subprocess.Popen, timeout_s: float = 240.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = re.search(r"Ray Serve replicas at (http://\S+)", log.read_text())
        if found:
            return found.group(1)
        if process.poll() is not None:
            raise AssertionError(f"serve --ray exited early:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)
    raise AssertionError(f"serve --ray did not start:\n{log.read_text()[-3000:]}")
