"""`specscale serve --ray` as a user runs it: a subprocess that starts its own local Ray instance, prints
where it serves once its replica is up, answers the OpenAI API, and on SIGTERM removes its application and
stops the Ray instance it started (exit 0, "SpecScale stopped"). Tiny random checkpoints, one replica."""

from __future__ import annotations

import signal
import sys

import httpx
from checkpoints import build_qwen_prm_checkpoint, build_stepping_generator
from server_process import RAY_URL, serving


def test_serve_ray_serves_and_stops_cleanly_on_sigterm(tmp_path):
    generator = build_stepping_generator(tmp_path / "gen", eos_rate=0.0)
    prm = build_qwen_prm_checkpoint(tmp_path / "prm")
    log = tmp_path / "serve.log"
    command = [sys.executable, "-m", "specscale.cli", "serve", "--ray", "--replicas", "1", "--replica-cpus", "0.5",
               "--threads", "1", "--port", "0", "--generator", str(generator), "--prm", str(prm),
               "--served-model-name", "tiny", "--generator-kv-gb", "0.1", "--prm-kv-gb", "0.1",
               "--lv-threshold-tokens", "256", "--log-level", "warning"]
    with serving(command, log, RAY_URL, check_health=False, start_timeout_s=240.0, stop_signal=signal.SIGTERM,
                 stop_timeout_s=60.0) as server:
        body = {"model": "tiny", "messages": [{"role": "user", "content": "Tom has 12 apples."}], "max_tokens": 16,
                "seed": 1, "search": {"beam_size": 4, "beam_width": 2, "max_rounds": 3}}
        answer = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
        assert answer.status_code == 200 and answer.json()["choices"][0]["message"]["content"]
        assert httpx.get(f"{server.url}/health", timeout=30).json()["replicas_healthy"] == 1
    server.assert_stopped_cleanly()
