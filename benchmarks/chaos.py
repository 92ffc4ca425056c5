"""Chaos on the Ray layout: replica processes killed under steady load, and what the clients saw.

    flock /tmp/specscale-cpu.lock python benchmarks/chaos.py --out docs/bench/chaos

Starts `specscale serve --ray --replicas 2 --verifier-replicas 1` (the bundled toy models unless
`--generator` / `--prm`; its own local Ray instance), keeps `--clients` closed-loop clients sending chat
searches (every other one streamed; every other stream unseeded, which cannot be replayed), and kills (SIGKILL) a busy generator replica's process
`--generator-kills` times, then the PRM replica's `--prm-kills` times, each once the layout has recovered
from the one before and `--spacing-s` of steady load later. Recovery: the time from the kill until /health
is "ok" again with a new replica in the victim's place.

Every request ends one of four ways: completed (200, a stream ending with `[DONE]`), failed (an HTTP
error, or a stream's error event the client can act on), truncated (a stream that stopped without either:
must be 0) or hung (no end within `--hang-s`: must be 0). A whole answer whose replica died is re-run on
another replica with its seed (the response's `X-SpecScale-Retries` counts the re-runs): none may fail. At
the end a fresh single-process `specscale serve` (an untouched server, the same models and threads)
answers every re-run request's seed again: the answers must be equal. Writes chaos.json, chaos.md and
raw.json (every request's record); exits 1 if a criterion fails.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from specscale_lab.tasks.toy import toy_problems  # noqa: E402

SEARCH = {"preset": "specscale", "beam_size": 8, "beam_width": 4, "max_rounds": 8}


@dataclass
class Record:
    seed: int
    stream: bool
    sent_s: float
    latency_s: float
    outcome: str  # completed, failed, truncated, hung
    status: int
    code: str
    retries: int  # X-SpecScale-Retries: re-runs before the answer (or the stream) began
    answer: str  # the best path's text (completed only)


@dataclass
class Kill:
    target: str  # generator or prm
    victim: str
    pid: int
    at_s: float
    in_flight: int  # the client's requests in flight at the kill
    recovered_s: float | None  # kill -> /health ok with the victim replaced (None: not within --recover-s)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--generator-kills", type=int, default=5)
    p.add_argument("--prm-kills", type=int, default=5)
    p.add_argument("--spacing-s", type=float, default=10.0, help="steady load between a recovery and the next kill")
    p.add_argument("--recover-s", type=float, default=240.0)
    p.add_argument("--hang-s", type=float, default=300.0, help="a request without an end this long is hung")
    p.add_argument("--generator", default=None)
    p.add_argument("--prm", default=None)
    p.add_argument("--out", default="results/chaos")
    return p.parse_args(argv)


def model_flags(args) -> list[str]:
    flags = ["--threads", "1", "--generator-kv-gb", "0.25", "--prm-kv-gb", "0.25", "--log-level", "warning"]
    for flag, value in (("--generator", args.generator), ("--prm", args.prm)):
        if value is not None:
            flags += [flag, value]
    return flags


def start(command: list[str], log: Path, pattern: str) -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=ROOT)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and process.poll() is None:
        found = re.search(pattern, log.read_text())
        if found:
            return process, found[1]
        time.sleep(0.5)
    process.kill()
    raise SystemExit(f"the server did not start:\n{log.read_text()[-3000:]}")


def stop(process: subprocess.Popen) -> int:
    process.send_signal(signal.SIGTERM)
    try:
        return process.wait(timeout=180)
    except subprocess.TimeoutExpired:
        process.kill()
        return -9


# ---- one request ---------------------------------------------------------------------------------------------
def seeded(index: int, stream: bool) -> bool:
    """Whole answers are all seeded; every other stream is not (one whose replica dies mid-way cannot be
    replayed: it must end with an error event)."""
    return not stream or index % 4 != 0


def body(question: str, index: int, stream: bool) -> dict:
    return {"messages": [{"role": "user", "content": question}], "seed": index if seeded(index, stream) else None,
            "max_tokens": 64, "temperature": 0.8, "stream": stream, "search": SEARCH}


async def whole(http: httpx.AsyncClient, payload: dict) -> tuple[str, int, str, int, str]:
    response = await http.post("/v1/chat/completions", json=payload)
    retries = int(response.headers.get("x-specscale-retries", 0))
    if response.status_code != 200:
        return "failed", response.status_code, response.json()["error"]["code"] or "", retries, ""
    return "completed", 200, "", retries, response.json()["choices"][0]["message"]["content"]


async def streamed(http: httpx.AsyncClient, payload: dict) -> tuple[str, int, str, int, str]:
    async with http.stream("POST", "/v1/chat/completions", json=payload) as response:
        retries = int(response.headers.get("x-specscale-retries", 0))
        if response.status_code != 200:
            await response.aread()
            return "failed", response.status_code, response.json()["error"]["code"] or "", retries, ""
        text, error = [], None
        async for line in response.aiter_lines():
            if line == "data: [DONE]":
                if error is not None:
                    return "failed", error.get("status", 503), error.get("code") or "", retries, ""
                return "completed", 200, "", retries, "".join(text)
            if line.startswith("data: "):
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    error = chunk["error"]
                for choice in chunk.get("choices", []):
                    if choice["index"] == 0:
                        text.append(choice.get("delta", {}).get("content") or "")
        if error is not None:
            return "failed", 503, error.get("code") or "", retries, ""
        return "truncated", 200, "", retries, ""


async def one(http, question: str, seed: int, stream: bool, started: float, hang_s: float) -> Record:
    sent = time.monotonic() - started
    try:
        result = await asyncio.wait_for((streamed if stream else whole)(http, body(question, seed, stream)), hang_s)
    except TimeoutError:
        result = ("hung", 0, "", 0, "")
    except httpx.HTTPError as error:  # the connection itself failed: no answer, no error event
        result = ("truncated" if stream else "failed", 0, type(error).__name__, 0, "")
    return Record(seed, stream, sent, time.monotonic() - started - sent, *result)


# ---- the load and the kills --------------------------------------------------------------------------------------
class Load:
    """`clients` closed-loop clients, each sending its next seeded search as soon as the last one ended."""

    def __init__(self, http: httpx.AsyncClient, clients: int, hang_s: float):
        self.http = http
        self.started = time.monotonic()
        self.records: list[Record] = []
        self.in_flight = 0
        self.running = True
        self.seeds = itertools.count(1)
        self.questions = [p.question for p in toy_problems("test", 100, seed=0)]
        self.tasks = [asyncio.create_task(self._client(hang_s)) for _ in range(clients)]

    def now(self) -> float:
        return time.monotonic() - self.started

    async def _client(self, hang_s: float) -> None:
        while self.running:
            seed = next(self.seeds)
            self.in_flight += 1
            record = await one(self.http, self.questions[seed % len(self.questions)], seed, seed % 2 == 0,
                               self.started, hang_s)
            self.in_flight -= 1
            self.records.append(record)

    async def stop(self) -> None:
        self.running = False
        await asyncio.gather(*self.tasks)


async def health(http: httpx.AsyncClient) -> dict:
    return (await http.get("/health")).json()


async def victim(http: httpx.AsyncClient, target: str) -> dict:
    """A generator replica with searches running (the first one if none is busy), or the PRM replica."""
    state = await health(http)
    if target == "prm":
        return state["verifier_replicas"][0]
    replicas = state["replicas"]
    return next((r for r in replicas if r["requests_running"] > 0), replicas[0])


async def recovered(http: httpx.AsyncClient, target: str, gone: str, limit_s: float) -> float | None:
    started = time.monotonic()
    while time.monotonic() - started < limit_s:
        try:
            state = await health(http)
        except (httpx.HTTPError, ValueError):
            state = {}
        listed = state.get("verifier_replicas" if target == "prm" else "replicas", [])
        if state.get("status") == "ok" and listed and gone not in {r["replica_id"] for r in listed}:
            return time.monotonic() - started
        await asyncio.sleep(0.25)
    return None


async def kill_once(load: Load, target: str, args) -> Kill:
    await asyncio.sleep(args.spacing_s)
    chosen = await victim(load.http, target)
    in_flight = load.in_flight
    os.kill(chosen["pid"], signal.SIGKILL)
    at = load.now()
    took = await recovered(load.http, target, chosen["replica_id"], args.recover_s)
    kill = Kill(target, chosen["replica_id"], chosen["pid"], round(at, 1), in_flight,
                None if took is None else round(took, 1))
    print(json.dumps(asdict(kill)), flush=True)
    return kill


async def chaos(url: str, args) -> tuple[list[Record], list[Kill], str]:
    async with httpx.AsyncClient(base_url=url, timeout=args.hang_s + 60,
                                 limits=httpx.Limits(max_connections=64)) as http:
        load = Load(http, args.clients, args.hang_s)
        kills = []
        for target in ["generator"] * args.generator_kills + ["prm"] * args.prm_kills:
            kills.append(await kill_once(load, target, args))
        await asyncio.sleep(args.spacing_s)
        await load.stop()
        metrics = (await http.get("/metrics")).text
    return load.records, kills, metrics


# ---- the untouched server, and the report ------------------------------------------------------------------------
async def reference_answers(url: str, records: list[Record]) -> dict[int, str]:
    """The answers of a fresh single-process server for these records' seeds (as whole answers)."""
    questions = [p.question for p in toy_problems("test", 100, seed=0)]
    async with httpx.AsyncClient(base_url=url, timeout=600) as http:
        answers = {}
        for r in records:
            _, status, _, _, text = await whole(http, body(questions[r.seed % len(questions)], r.seed, False))
            answers[r.seed] = text if status == 200 else f"<{status}>"
    return answers


def metric(text: str, series: str) -> float:
    found = re.search(rf"^{re.escape(series)} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def summarize(records: list[Record], kills: list[Kill], metrics: str, equal: dict) -> dict:
    by = Counter((("stream" if r.stream else "whole"), r.outcome) for r in records)
    recoveries = {t: [k.recovered_s for k in kills if k.target == t] for t in ("generator", "prm")}
    checks = {
        "hung_0": by[("whole", "hung")] + by[("stream", "hung")] == 0,
        "truncated_streams_0": by[("stream", "truncated")] == 0,
        "failed_whole_answers_0": by[("whole", "failed")] == 0,
        "every_kill_recovered": all(k.recovered_s is not None for k in kills),
        "retried_answers_equal_untouched_server": all(equal.values()) and len(equal) > 0,
    }
    return {"sent": len(records), "by_kind_and_outcome": {f"{k} {o}": n for (k, o), n in sorted(by.items())},
            "whole_answers_re_run": sum(1 for r in records if not r.stream and r.retries),
            "streams_re_run_before_opening": sum(1 for r in records if r.stream and r.retries),
            "ingress_re_runs": metric(metrics, 'specscale_request_retries_total{outcome="retried"}'),
            "ingress_not_re_run": metric(metrics, 'specscale_request_retries_total{outcome="not_retried"}'),
            "replica_failures_seen": metric(metrics, "specscale_replica_failures_total"),
            "prm_calls_re_sent_by_live_replicas": metric(metrics, "specscale_prm_call_retries_total"),
            "stream_error_codes": dict(Counter(r.code for r in records if r.stream and r.outcome == "failed")),
            "unseeded_streams": sum(1 for r in records if r.stream and not seeded(r.seed, True)),
            "recovery_s": recoveries, "retried_answers_checked": len(equal),
            "retried_answers_equal": sum(equal.values()), "checks": checks, "passed": all(checks.values())}


def write_markdown(report: dict, path: Path) -> None:
    s = report["summary"]
    lines = ["# Chaos on `specscale serve --ray --replicas 2 --verifier-replicas 1`", "",
             f"`{report['command']}` ({report['date']}, {report['machine']})", "",
             "| kill | target | in flight | recovered after |", "|---|---|---|---|"]
    lines += [f"| {i} | {k['target']} replica (pid {k['pid']}) | {k['in_flight']} | "
              f"{'-' if k['recovered_s'] is None else format(k['recovered_s'], '.1f') + ' s'} |"
              for i, k in enumerate(report["kills"], 1)]
    lines += ["", "| | |", "|---|---|", f"| requests sent | {s['sent']} |"]
    lines += [f"| {key} | {value} |" for key, value in s["by_kind_and_outcome"].items()]
    lines += [f"| whole answers re-run after a replica failure (X-SpecScale-Retries > 0) | "
              f"{s['whole_answers_re_run']} |",
              f"| streams re-run before they opened | {s['streams_re_run_before_opening']} |",
              f"| re-runs counted by the ingress (re-run / not re-run) | {s['ingress_re_runs']:g} / "
              f"{s['ingress_not_re_run']:g} |",
              f"| scoring calls re-sent by the generator replicas still alive at the end | "
              f"{s['prm_calls_re_sent_by_live_replicas']:g} |",
              f"| streams ended by an error event (codes; {s['unseeded_streams']} streams were unseeded) | "
              f"{s['stream_error_codes'] or 'none'} |",
              f"| re-run answers equal to an untouched server's for the same seed | {s['retried_answers_equal']} / "
              f"{s['retried_answers_checked']} |",
              "| verdict | " + ("PASS" if s["passed"] else "FAIL") + ": " + ", ".join(
                  f"{name} {'ok' if ok else 'FAILED'}" for name, ok in s["checks"].items()) + " |"]
    path.write_text("\n".join(lines) + "\n")


def machine() -> str:
    info = Path("/proc/cpuinfo").read_text()
    model = re.search(r"model name\s*:\s*(.*)", info)
    return f"{model[1] if model else 'CPU'}, {os.cpu_count()} cores"


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ray_command = [sys.executable, "-m", "specscale.cli", "serve", "--ray", "--replicas", "2", "--replica-cpus", "0.5",
                   "--verifier-replicas", "1", "--verifier-cpus", "0.5", "--port", "0", *model_flags(args)]
    process, url = start(ray_command, out / "ray-serve.log", r"Ray Serve replicas at (http://\S+)")
    try:
        records, kills, metrics = asyncio.run(chaos(url, args))
    finally:
        ray_exit = stop(process)
    re_run = [r for r in records if r.retries and r.outcome == "completed"]
    plain = [sys.executable, "-m", "specscale.cli", "serve", "--port", "0", *model_flags(args)]
    untouched, plain_url = start(plain, out / "untouched-serve.log", r" at (http://\S+)")
    try:
        reference = asyncio.run(reference_answers(plain_url, re_run))
    finally:
        stop(untouched)
    equal = {r.seed: reference[r.seed] == r.answer for r in re_run}
    report = {"command": "python benchmarks/chaos.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": machine(),
              "ray_exit_code": ray_exit, "kills": [asdict(k) for k in kills],
              "summary": summarize(records, kills, metrics, equal), "records": [asdict(r) for r in records],
              "re_run_answers_equal": equal}
    (out / "raw.json").write_text(json.dumps({"records": report.pop("records")}))  # per request: not committed
    (out / "chaos.json").write_text(json.dumps(report, indent=1))
    write_markdown(report, out / "chaos.md")
    print((out / "chaos.md").read_text())
    return 0 if report["summary"]["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
