"""Load-test `specscale serve --ray` co-located and disaggregated with `specscale bench serve`
(docs/bench/serve-scaleout.md, "Scale-out on Ray Serve"; docs/scale-out.md).

For each layout it starts the server (its own local Ray instance), waits for it, runs `specscale bench
serve` `--rounds` times, reads the PRM batch sizes from /metrics, stops the server with SIGTERM, and at
the end prints one Markdown table row per layout (medians over the rounds). Extra arguments after `--`
go to every `specscale serve` (e.g. `-- --generator PATH --prm PATH`).

    python benchmarks/scaleout_serve.py --out results/scaleout --rounds 3
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

LAYOUTS = {  # name -> `specscale serve` flags
    "colocated-1": ["--ray", "--replicas", "1", "--replica-cpus", "1"],
    "colocated-2": ["--ray", "--replicas", "2", "--replica-cpus", "1"],
    "disaggregated-1+1": ["--ray", "--replicas", "1", "--replica-cpus", "1", "--verifier-replicas", "1",
                          "--verifier-cpus", "1"],
    "disaggregated-2+1": ["--ray", "--replicas", "2", "--replica-cpus", "0.5", "--threads", "1",
                          "--verifier-replicas", "1", "--verifier-cpus", "1"],
}
LOAD = ["--rate", "inf", "--preset", "specscale", "--beam-size", "8", "--seed", "0"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="results/scaleout")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--layouts", default=",".join(LAYOUTS), help=f"comma-separated, of {sorted(LAYOUTS)}")
    p.add_argument("--port", type=int, default=8810)
    p.add_argument("--requests", type=int, default=64, help="requests per round, all sent at once")
    p.add_argument("serve_args", nargs="*", help="after --: passed to every `specscale serve`")
    args = p.parse_args()
    out = Path(args.out)
    rows = [measure(name, out / name, args) for name in args.layouts.split(",")]
    print("\n| layout | req/s (rounds) | median req/s | output tok/s | latency p50 / p90 | paths per PRM batch "
          "| PRM batches with both generator replicas |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for row in rows:
        print(row)
    return 0


def measure(name: str, out: Path, args) -> str:
    out.mkdir(parents=True, exist_ok=True)
    log = out / "serve.log"
    command = [sys.executable, "-m", "specscale.cli", "serve", *LAYOUTS[name], "--port", str(args.port),
               "--log-level", "warning", *args.serve_args]
    with open(log, "w") as sink:
        server = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)
    try:
        url = wait_for_url(log, server)
        summaries = [bench(url, out / f"round{i}", args.requests) for i in range(args.rounds)]
        metrics = httpx.get(f"{url}/metrics", timeout=30).text
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=120)
    return row(name, summaries, metrics)


def wait_for_url(log: Path, server: subprocess.Popen, timeout_s: float = 600) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = re.search(r"Ray Serve replicas at (http://\S+)", log.read_text())
        if found:
            return found.group(1)
        if server.poll() is not None:
            raise SystemExit(f"the server exited:\n{log.read_text()[-3000:]}")
        time.sleep(0.5)
    raise SystemExit(f"the server did not start:\n{log.read_text()[-3000:]}")


def bench(url: str, out: Path, requests: int) -> dict:
    subprocess.run([sys.executable, "-m", "specscale.cli", "bench", "serve", "--url", url, *LOAD,
                    "--num-requests", str(requests), "--out", str(out)], check=True, stdout=subprocess.DEVNULL)
    return json.loads((out / "serve.json").read_text())["summary"]


def row(name: str, summaries: list[dict], metrics: str) -> str:
    rates = [s["request_throughput"] for s in summaries]
    median = summaries[rates.index(statistics.median_low(rates))]
    latency = median["latency_s"]
    paths = metric(metrics, "specscale_verifier_batch_size_sum") / max(metric(metrics, "specscale_verifier_batch_size_count"), 1)
    merged = metric(metrics, 'specscale_prm_batches_total{generator_replicas="2"}')
    batches = sum(float(v) for v in re.findall(r"^specscale_prm_batches_total\{[^}]*\} (\S+)$", metrics, re.MULTILINE))
    merged_text = f"{merged:g} of {batches:g}" if batches else "n/a (co-located)"
    if batches:  # the PRM replica's batches merge the generator replicas' calls
        paths = metric(metrics, "specscale_prm_paths_total") / batches
    errors = sum(sum(s["errors_by_status"].values()) for s in summaries)
    if batches:  # where a generator replica's scoring calls spent their time
        waited, scoring = metric(metrics, "specscale_prm_call_seconds_total"), metric(metrics, "specscale_prm_batch_seconds_total")
        calls = metric(metrics, "specscale_prm_calls_total")
        print(f"{name}: {calls:g} scoring calls waited {waited:.1f} s in all ({1000 * waited / calls:.1f} ms each); "
              f"the PRM scored its {batches:g} batches in {scoring:.1f} s ({1000 * scoring / batches:.1f} ms each)")
    return (f"| {name} | {', '.join(f'{r:.2f}' for r in rates)} | {statistics.median(rates):.2f} "
            f"| {median['output_tokens_per_s']:.0f} | {latency['p50']:.1f} s / {latency['p90']:.1f} s "
            f"| {paths:.1f} | {merged_text} |" + (f" errors: {errors}" if errors else ""))


def metric(text: str, series: str) -> float:
    found = re.search(rf"^{re.escape(series)} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


if __name__ == "__main__":
    raise SystemExit(main())
