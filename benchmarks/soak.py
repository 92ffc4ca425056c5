"""Soak: `specscale serve` under an hour (`--minutes`) of realistic mixed load, checking that nothing leaks.

    flock /tmp/specscale-cpu.lock python benchmarks/soak.py --minutes 10 --out docs/bench/soak

Starts `specscale serve` (the bundled toy models unless `--generator` / `--prm`), measures its capacity
briefly (closed loop, `--capacity-s`; or take `--rate`), then sends Poisson arrivals at `--load` (70%) of
it through the official `openai` client: chat and text completions, streamed and not, every preset in
turn; ~10% of the clients disconnect mid-stream, ~1% send a hostile body (malformed JSON, a field of the
wrong type, an over-long prompt), a few are slow (they read a stream slowly, or dribble their body). Every
`--sample-s` (30 s) it samples the server process (RSS, open descriptors, threads), its /health (KV blocks
of generator and PRM, running and waiting searches) and the client's p50 / p99 latency. Every
`--drain-every-s` it stops sending until nothing is in flight (the server drains), and checks there: the
generator KV is back at its idle baseline, and the client's count of every request's outcome (completed,
cancelled by its client, refused with a 4xx and its reason) equals the server's `specscale_requests_total`
exactly. Writes soak.json (series, drains, verdict), soak.md, soak.png and raw.json (every request's record);
exits 1 if a criterion fails.

`--memory-probe` runs no server: it measures what made RSS creep in earlier soaks (oneDNN keeps a JIT
primitive per distinct row count of a linear's input) in two fresh processes, random row counts through one
oneDNN linear unpadded and then padded (model/row_padding.py), and writes memory_probe.json.

Pass criteria (docs/bench/serve-soak.md, "Soak"): after `--warmup-minutes` RSS grows < 2%/hour (the Theil-Sen
slope over the samples, reported with its 95% interval; `--no-rss-criterion` for runs too short for a slope to mean anything), generator
KV at its idle baseline at every drain, descriptors and threads flat (at the drains after the warm-up no
more than `--flat-tolerance` above the first one), no 5xx on either side, every request accounted for.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import numpy as np
import openai

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from specscale.search.presets import PRESETS  # noqa: E402
from specscale_lab.tasks.toy import toy_problems  # noqa: E402

CHAT, TEXT = "/v1/chat/completions", "/v1/completions"
SEARCH = {"beam_size": 8, "beam_width": 4, "max_rounds": 6}  # a search of a second or so on the toy models
# A client that disconnects does so at its stream's first progress event, from a search of up to 1000 rounds:
# usually still running then. When the server ran ahead and the stream's end had already arrived, the client
# sees it and counts the request completed, as the server does; a close that reaches the server before the
# search's end makes the server count it cancelled, as the client does (server/app.py, `client_gone`).
LONG_SEARCH = {"preset": "beam", "beam_size": 16, "beam_width": 4, "max_rounds": 1000}
HOSTILE = {  # name -> (body bytes or a JSON payload, route)
    "malformed_json": (b'{"messages": [{"role": "user", "content": "2 + 2', CHAT),
    "wrong_type_n": ({"messages": [{"role": "user", "content": "What is 2 + 3?"}], "n": "2"}, CHAT),
    "wrong_type_messages": ({"messages": "What is 2 + 3?"}, CHAT),
    "wrong_type_search": ({"prompt": "What is 2 + 3?", "search": {"beam_size": "eight"}}, TEXT),
    "over_long_prompt": ({"prompt": "What is 2 + 3? " * 20_000}, TEXT),
}


# ---- what one request did ----------------------------------------------------------------------------------
@dataclass
class Record:
    kind: str  # normal, disconnect, slow_reader, slow_sender, hostile:<name>
    route: str
    outcome: str  # completed, cancelled, refused, failed
    status: int
    reason: str  # the error code ("" when completed)
    sent_s: float
    latency_s: float

    @property
    def key(self) -> tuple[str, str, int, str]:
        return (self.route, self.outcome, self.status, self.reason)


@dataclass
class Load:
    """The client side: the server's URL, the mix, and every request's record."""

    url: str
    model: str
    questions: list[str]
    started: float = field(default_factory=time.monotonic)
    records: list[Record] = field(default_factory=list)
    in_flight: set = field(default_factory=set)
    sent: int = 0

    def now(self) -> float:
        return time.monotonic() - self.started


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=60.0)
    p.add_argument("--rate", type=float, default=None, help="requests/s (default: --load x the measured capacity)")
    p.add_argument("--load", type=float, default=0.7, help="fraction of the measured capacity")
    p.add_argument("--capacity-s", type=float, default=60.0, help="seconds of the closed-loop capacity measurement")
    p.add_argument("--capacity-clients", type=int, default=16)
    p.add_argument("--sample-s", type=float, default=30.0)
    p.add_argument("--drain-every-s", type=float, default=120.0)
    p.add_argument("--warmup-minutes", type=float, default=None, help="default: a fifth of the run, at most 10")
    p.add_argument("--flat-tolerance", type=int, default=8, help="descriptors / threads a drain may show above the "
                   "first drain after the warm-up")
    p.add_argument("--no-rss-criterion", action="store_true", help="report the RSS slope without judging it")
    p.add_argument("--disconnect-share", type=float, default=0.10)
    p.add_argument("--hostile-share", type=float, default=0.01)
    p.add_argument("--slow-share", type=float, default=0.03)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="results/soak")
    p.add_argument("--threads", type=int, default=None, help="the server's torch threads")
    p.add_argument("--generator", default=None)
    p.add_argument("--prm", default=None)
    p.add_argument("--serve-arg", action="append", default=[], help="one more `specscale serve` argument (repeat)")
    p.add_argument("--memory-probe", action="store_true", help="no server: run random row counts through one "
                   "oneDNN linear, unpadded then padded (model/row_padding.py), each in a fresh process, and "
                   "report the RSS each ends at (memory_probe.json)")
    p.add_argument("--memory-probe-steps", type=int, default=3000)
    p.add_argument("--memory-probe-run", choices=["unpadded", "padded"], help=argparse.SUPPRESS)
    return p.parse_args(argv)


# ---- the server ----------------------------------------------------------------------------------------------
def start_server(args, log: Path) -> tuple[subprocess.Popen, str]:
    command = [sys.executable, "-m", "specscale.cli", "serve", "--port", "0", "--log-level", "warning"]
    for flag, value in (("--generator", args.generator), ("--prm", args.prm), ("--threads", args.threads)):
        if value is not None:
            command += [flag, str(value)]
    command += args.serve_arg
    process = subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=ROOT)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and process.poll() is None:
        found = re.search(r" at (http://\S+)", log.read_text())
        if found and httpx.get(f"{found[1]}/health", timeout=30).status_code == 200:
            return process, found[1]
        time.sleep(0.2)
    process.kill()
    raise SystemExit(f"the server did not start:\n{log.read_text()[-3000:]}")


def process_sample(pid: int) -> dict:
    """RSS, threads and descriptors of the server; `client_connections`: how many of the descriptors are TCP
    connections a client holds open (its idle keep-alive pool, which a drain does not close), so that
    `fds - client_connections` is what the server itself holds."""
    status = Path(f"/proc/{pid}/status").read_text()
    rss_kib = int(re.search(r"VmRSS:\s+(\d+)", status)[1])
    threads = int(re.search(r"Threads:\s+(\d+)", status)[1])
    links = fd_links(pid)
    established = established_socket_inodes(pid)
    connections = sum(link.removeprefix("socket:[").removesuffix("]") in established for link in links)
    return {"rss_mib": round(rss_kib / 1024, 1), "fds": len(links), "client_connections": connections,
            "threads": threads}


def fd_links(pid: int) -> list[str]:
    """What each open descriptor of the process points at; one closed between the listing and its read is
    left out."""
    links = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            links.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except FileNotFoundError:
            continue
    return links


def established_socket_inodes(pid: int) -> set[str]:
    """The inodes of the process's TCP sockets in state ESTABLISHED (01), IPv4 and IPv6."""
    inodes = set()
    for table in ("tcp", "tcp6"):
        path = Path(f"/proc/{pid}/net/{table}")
        rows = path.read_text().splitlines()[1:] if path.exists() else []
        inodes |= {fields[9] for fields in map(str.split, rows) if fields[3] == "01"}
    return inodes


def server_fds(drain_row: dict) -> int:
    """The descriptors the server holds beyond its clients' open connections."""
    return drain_row["fds"] - drain_row.get("client_connections", 0)


async def server_counts(http: httpx.AsyncClient) -> tuple[Counter, int]:
    """The server's completion-request outcomes (`specscale_requests_total`) and its 5xx responses."""
    text = (await http.get("/metrics")).text
    outcomes = Counter()
    pattern = r'^specscale_requests_total\{route="([^"]*)",outcome="(\w+)",status="(\d+)",reason="([^"]*)"\} (\S+)$'
    for route, outcome, status, reason, value in re.findall(pattern, text, re.MULTILINE):
        outcomes[(route, outcome, int(status), reason)] = int(float(value))
    five = re.findall(r'^specscale_http_responses_total\{route="[^"]*",status="5\d\d"\} (\S+)$', text, re.MULTILINE)
    return outcomes, int(sum(float(v) for v in five))


# ---- the requests ----------------------------------------------------------------------------------------------
def normal_fields(load: Load, index: int, preset: str, search: dict | None = None) -> dict:
    return {"model": load.model, "max_tokens": 64, "temperature": 0.8, "seed": index,
            "extra_body": {"search": {"preset": preset, **(search or SEARCH)}}}


async def normal(load: Load, client: openai.AsyncOpenAI, index: int, preset: str, chat: bool, stream: bool,
                 slow: bool = False) -> tuple[str, int, str]:
    """(outcome, status, reason) of a chat or text completion through the openai client."""
    question = load.questions[index % len(load.questions)]
    fields = normal_fields(load, index, preset)
    try:
        if chat:
            response = await client.chat.completions.create(messages=[{"role": "user", "content": question}],
                                                            stream=stream, **fields)
        else:
            response = await client.completions.create(prompt=question, stream=stream, **fields)
        if stream:
            async for _ in response:
                if slow:
                    await asyncio.sleep(0.2)
        return "completed", 200, ""
    except openai.APIStatusError as error:
        return error_outcome(error.status_code, (error.body or {}).get("code"))
    except openai.APIError as error:  # an error event inside a stream: 504 past its budget, 503 otherwise
        code = error.code or ""
        return error_outcome(504 if code == "timeout" else 503, code)


def error_outcome(status: int, code: str | None) -> tuple[str, int, str]:
    return ("refused" if status < 500 else "failed"), status, code or ""


async def disconnect(load: Load, index: int) -> tuple[str, int, str]:
    """A stream of a long search, closed by its client at its first progress event (a plain socket, so that
    it can see whether the end of the stream had already arrived: then it was completed, not cancelled)."""
    question = load.questions[index % len(load.questions)]
    payload = {"model": load.model, "messages": [{"role": "user", "content": question}], "max_tokens": 64,
               "temperature": 1.2, "seed": index, "stream": True, "search": LONG_SEARCH}
    return await asyncio.to_thread(_disconnecting_client, load.url, json.dumps(payload).encode())


def _disconnecting_client(url: str, payload: bytes) -> tuple[str, int, str]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=900) as sock:
        sock.sendall(f"POST {CHAT} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode() + payload)
        received = b""
        while b"search_progress" not in received and b"data: [DONE]" not in received:
            chunk = sock.recv(65536)
            if not chunk:
                break
            received += chunk
        received += _already_arrived(sock)
    status = int(received.split(b" ", 2)[1])
    if status != 200:
        return error_outcome(status, json.loads(received.split(b"\r\n\r\n", 1)[1])["error"]["code"])
    return ("completed", 200, "") if b"data: [DONE]" in received else ("cancelled", 499, "client_closed")


def _already_arrived(sock: socket.socket) -> bytes:
    """What the socket holds now, without waiting for more."""
    sock.setblocking(False)
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except (BlockingIOError, ConnectionError):
        pass
    return received


async def slow_sender(load: Load, http: httpx.AsyncClient, index: int) -> tuple[str, int, str]:
    """A whole body dribbled in 5 pieces over ~2 s (well within the server's body timeout)."""
    question = load.questions[index % len(load.questions)]
    payload = json.dumps({"model": load.model, "prompt": question, "seed": index, "max_tokens": 64,
                          "search": SEARCH}).encode()
    pieces = [payload[k * len(payload) // 5:(k + 1) * len(payload) // 5] for k in range(5)]

    async def dribble():
        for piece in pieces:
            yield piece
            await asyncio.sleep(0.4)

    response = await http.post(TEXT, content=dribble(), headers={"Content-Type": "application/json"})
    return outcome_of_response(response)


async def hostile(http: httpx.AsyncClient, name: str) -> tuple[str, int, str]:
    body, route = HOSTILE[name]
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = await http.post(route, content=content, headers={"Content-Type": "application/json"})
    return outcome_of_response(response)


def outcome_of_response(response: httpx.Response) -> tuple[str, int, str]:
    if response.status_code == 200:
        return "completed", 200, ""
    return error_outcome(response.status_code, response.json()["error"]["code"])


EVERY_KIND = ("disconnect", "slow_reader", "slow_sender", *(f"hostile:{name}" for name in sorted(HOSTILE)))


def pick_kind(rng: random.Random, args) -> str:
    draw = rng.random()
    if draw < args.hostile_share:
        return f"hostile:{rng.choice(sorted(HOSTILE))}"
    if draw < args.hostile_share + args.disconnect_share:
        return "disconnect"
    if draw < args.hostile_share + args.disconnect_share + args.slow_share:
        return rng.choice(["slow_reader", "slow_sender"])
    return "normal"


async def one_request(load: Load, client, http, kind: str, index: int) -> None:
    preset = sorted(PRESETS)[index % len(PRESETS)]
    chat, stream = index % 2 == 0, (index // 2) % 2 == 0
    sent = load.now()
    if kind == "normal":
        route, result = (CHAT if chat else TEXT), await normal(load, client, index, preset, chat, stream)
    elif kind == "slow_reader":
        route, result = CHAT, await normal(load, client, index, preset, True, True, slow=True)
    elif kind == "slow_sender":
        route, result = TEXT, await slow_sender(load, http, index)
    elif kind == "disconnect":
        route, result = CHAT, await disconnect(load, index)
    else:
        name = kind.split(":", 1)[1]
        route, result = HOSTILE[name][1], await hostile(http, name)
    load.records.append(Record(kind, route, *result, sent, load.now() - sent))


def spawn(load: Load, client, http, kind: str) -> None:
    task = asyncio.create_task(one_request(load, client, http, kind, load.sent))
    load.sent += 1
    load.in_flight.add(task)
    task.add_done_callback(load.in_flight.discard)


# ---- capacity, the load, the samples, the drains ----------------------------------------------------------------
async def measure_capacity(load: Load, client, args) -> float:
    """Completed normal requests per second with `--capacity-clients` clients in a closed loop."""
    ends = load.now() + args.capacity_s
    completed = 0

    async def loop_client(first: int) -> None:
        nonlocal completed
        index = first
        while load.now() < ends:
            preset = sorted(PRESETS)[index % len(PRESETS)]
            outcome, _, _ = await normal(load, client, 10_000_000 + index, preset, index % 2 == 0, False)
            completed += outcome == "completed"
            index += args.capacity_clients

    started = load.now()
    await asyncio.gather(*(loop_client(i) for i in range(args.capacity_clients)))
    return completed / (load.now() - started)


async def sample(load: Load, http: httpx.AsyncClient, pid: int, since: float) -> dict:
    health = (await http.get("/health")).json()
    window = [r.latency_s for r in load.records if r.kind == "normal" and r.outcome == "completed"
              and r.sent_s + r.latency_s >= since]
    latency = {f"p{q}_s": round(float(np.percentile(window, q)), 3) if window else None for q in (50, 99)}
    return {"t_s": round(load.now(), 1), **process_sample(pid), "kv_blocks_used": health["kv_blocks_used"],
            "prm_kv_blocks_used": health["prm_kv_blocks_used"], "running": health["requests_running"],
            "waiting": health["requests_waiting"], "client_in_flight": len(load.in_flight), "sent": load.sent,
            "completed_in_window": len(window), **latency}


async def drain(load: Load, http: httpx.AsyncClient, pid: int, baseline: Counter) -> dict:
    """Wait until nothing is in flight and the server is idle; what it holds then, and the accounting."""
    started = load.now()
    while load.in_flight:
        await asyncio.wait(set(load.in_flight))
    health = (await http.get("/health")).json()
    while health["requests_running"] or health["requests_waiting"]:
        await asyncio.sleep(0.05)
        health = (await http.get("/health")).json()
    server, fives = await server_counts(http)
    client = Counter(r.key for r in load.records)
    server_delta = Counter({key: server[key] - baseline.get(key, 0) for key in server})
    server_delta = +server_delta  # drop zeros
    return {"t_s": round(load.now(), 1), "waited_s": round(load.now() - started, 1), **process_sample(pid),
            "kv_blocks_used": health["kv_blocks_used"], "prm_kv_blocks_used": health["prm_kv_blocks_used"],
            "live_sequences": health["live_sequences"], "requests": len(load.records), "server_5xx": fives,
            "counts_equal": client == server_delta, "client_counts": _keyed(client),
            "server_counts": _keyed(server_delta)}


def _keyed(counts: Counter) -> dict:
    return {" ".join(map(str, key)): value for key, value in sorted(counts.items())}


async def run_load(load: Load, client, http, pid: int, args, rate: float, baseline: Counter, idle: dict) -> tuple:
    rng = random.Random(args.seed)
    ends = load.now() + args.minutes * 60
    samples, drains = [], []
    for kind in EVERY_KIND:  # one of each first, so that even a short run covers every kind
        spawn(load, client, http, kind)
    next_sample, next_drain, window_start = load.now(), load.now() + args.drain_every_s, load.now()
    while load.now() < ends:
        await asyncio.sleep(rng.expovariate(rate))
        spawn(load, client, http, pick_kind(rng, args))
        if load.now() >= next_sample:
            samples.append(await sample(load, http, pid, window_start))
            window_start, next_sample = load.now(), next_sample + args.sample_s
            print(json.dumps(samples[-1]), flush=True)
        if load.now() >= next_drain and load.now() < ends - args.drain_every_s / 4:
            drains.append(await drain(load, http, pid, baseline))
            print("drain", json.dumps({k: v for k, v in drains[-1].items() if "counts" not in k}), flush=True)
            next_drain = load.now() + args.drain_every_s
    drains.append(await drain(load, http, pid, baseline))
    samples.append(await sample(load, http, pid, window_start))
    return samples, drains


# ---- the verdict -------------------------------------------------------------------------------------------------
def rss_growth_pct_per_hour(samples: list[dict], warmup_s: float) -> dict | None:
    """RSS growth after the warm-up in % of its median per hour: the Theil-Sen slope (the median of the slopes
    between every pair of samples, which a few allocator steps that come and go cannot drag the way they drag
    a least-squares line) with its 95% interval (Sen's, scipy.stats.theilslopes); None under 3 samples."""
    from scipy.stats import theilslopes

    after = [s for s in samples if s["t_s"] >= warmup_s]
    if len(after) < 3:
        return None
    t = np.array([s["t_s"] for s in after])
    rss = np.array([s["rss_mib"] for s in after])
    slope, _, low, high = theilslopes(rss, t, alpha=0.95)  # MiB per second
    scale = 3600 / float(np.median(rss)) * 100
    return {"slope": float(slope * scale), "low": float(low * scale), "high": float(high * scale),
            "mib_per_hour": float(slope * 3600), "samples": len(after)}


def verdict(samples, drains, load: Load, idle: dict, args, warmup_s: float) -> dict:
    records = load.records
    after = [d for d in drains if d["t_s"] >= warmup_s] or drains[-1:]
    growth = rss_growth_pct_per_hour(samples, warmup_s)
    statuses = Counter(r.status for r in records)
    checks = {
        "rss_growth_below_2pct_per_hour": None if args.no_rss_criterion or growth is None else growth["slope"] < 2.0,
        "generator_kv_at_idle_baseline_at_every_drain": all(d["kv_blocks_used"] == idle["kv_blocks_used"]
                                                            and d["live_sequences"] == 0 for d in drains),
        "fds_flat": max(map(server_fds, after)) <= server_fds(after[0]) + args.flat_tolerance,
        "threads_flat": max(d["threads"] for d in after) <= after[0]["threads"] + args.flat_tolerance,
        "no_5xx": not any(status >= 500 for status in statuses) and drains[-1]["server_5xx"] == idle["server_5xx"],
        "every_request_accounted_for": len(records) == load.sent
        and all(r.outcome in ("completed", "cancelled", "refused") for r in records),
        "client_counts_equal_server_counts_at_every_drain": all(d["counts_equal"] for d in drains),
    }
    return {"passed": all(v is not False for v in checks.values()), "checks": checks,
            "rss_growth_pct_per_hour": growth, "warmup_s": warmup_s}


# ---- the report --------------------------------------------------------------------------------------------------
def summary_rows(report: dict) -> list[tuple[str, str]]:
    samples, drains, v = report["samples"], report["drains"], report["verdict"]
    kinds = report["requests_by_kind"]
    after = [s for s in samples if s["t_s"] >= v["warmup_s"]] or samples
    growth = v["rss_growth_pct_per_hour"]
    p50 = [s["p50_s"] for s in after if s["p50_s"] is not None]
    p99 = [s["p99_s"] for s in after if s["p99_s"] is not None]
    return [
        ("duration", f"{report['minutes']:g} min, {len(samples)} samples every {report['sample_s']:g} s, "
                     f"{len(drains)} drains, warm-up {v['warmup_s'] / 60:g} min"),
        ("capacity (closed loop) / offered rate (Poisson)",
         f"{report['capacity_rps'] or 0:.2f} req/s / {report['rate_rps']:.2f} req/s" if report["capacity_rps"]
         else f"not measured / {report['rate_rps']:.2f} req/s (--rate)"),
        ("requests sent", f"{report['sent']:,} ({', '.join(f'{k} {n}' for k, n in sorted(kinds.items()))})"),
        ("outcomes (client = server)", ", ".join(f"{k} {n}" for k, n in sorted(report["outcomes"].items()))),
        ("RSS after warm-up", f"{min(s['rss_mib'] for s in after):,.0f}-{max(s['rss_mib'] for s in after):,.0f} MiB, "
                              f"Theil-Sen slope {growth['slope']:+.2f}%/h (95% interval {growth['low']:+.2f} to "
                              f"{growth['high']:+.2f}%/h; {growth['mib_per_hour']:+.1f} MiB/h)"
         if growth is not None else "too few samples"),
        ("generator KV blocks at the drains", ", ".join(str(d["kv_blocks_used"]) for d in drains)),
        ("PRM KV blocks at the drains (cached step prefixes)", ", ".join(str(d["prm_kv_blocks_used"]) for d in drains)),
        ("open descriptors at the drains (less clients' open connections)",
         ", ".join(f"{d['fds']} ({server_fds(d)})" for d in drains)),
        ("threads at the drains", ", ".join(str(d["threads"]) for d in drains)),
        ("latency p50 / p99 per sample after warm-up (normal requests)",
         f"{np.median(p50):.2f} s / {np.median(p99):.2f} s (medians; worst p99 {max(p99):.2f} s)" if p99 else "-"),
        ("5xx (client / server)", f"{report['client_5xx']} / "
                                 f"{drains[-1]['server_5xx']}"),
        ("verdict", ("PASS" if v["passed"] else "FAIL") + ": " + ", ".join(
            f"{name} {'-' if ok is None else 'ok' if ok else 'FAILED'}" for name, ok in v["checks"].items())),
    ]


def write_markdown(report: dict, path: Path) -> None:
    lines = [f"# Soak: {report['minutes']:g} minutes of mixed load on `specscale serve`", "",
             f"`{report['command']}` ({report['date']}, {report['machine']})", "", "| | |", "|---|---|"]
    lines += [f"| {name} | {value} |" for name, value in summary_rows(report)]
    path.write_text("\n".join(lines) + "\n")


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples, drains = report["samples"], report["drains"]
    t = [s["t_s"] / 60 for s in samples]
    panels = [("RSS (MiB)", ["rss_mib"]), ("descriptors, threads", ["fds", "threads"]),
              ("KV blocks in use", ["kv_blocks_used", "prm_kv_blocks_used"]),
              ("searches", ["running", "waiting", "client_in_flight"]), ("latency (s)", ["p50_s", "p99_s"])]
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 2.1 * len(panels)), sharex=True)
    for ax, (title, keys) in zip(axes, panels, strict=True):
        for key in keys:
            ax.plot(t, [s[key] if s[key] is not None else np.nan for s in samples], marker=".", label=key)
        for d in drains:
            ax.axvline(d["t_s"] / 60, color="grey", linewidth=0.6, linestyle=":")
        ax.axvline(report["verdict"]["warmup_s"] / 60, color="red", linewidth=0.8, linestyle="--")
        ax.set_ylabel(title)
        ax.legend(fontsize=7, loc="upper left")
    axes[-1].set_xlabel("minutes (dotted: drains; dashed: end of warm-up)")
    fig.suptitle(f"specscale serve soak: {report['rate_rps']:.2f} req/s Poisson, {report['sent']:,} requests")
    fig.tight_layout()
    fig.canvas.draw()
    from PIL import Image  # matplotlib's own dependency

    # a palette of 64 colours: a line plot needs no more, and the PNG is a fraction of the size (docs/bench)
    image = Image.frombuffer("RGBA", fig.canvas.get_width_height(), fig.canvas.buffer_rgba()).convert("RGB")
    image.quantize(64).save(path, optimize=True)
    plt.close(fig)


def machine() -> str:
    info = Path("/proc/cpuinfo").read_text()
    model = re.search(r"model name\s*:\s*(.*)", info)
    flags = set(re.search(r"flags\s*:\s*(.*)", info)[1].split())
    isa = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
    return f"{model[1] if model else 'CPU'}, {os.cpu_count()} cores, {'/'.join(isa)}"


# ---- the memory probe: oneDNN's primitive cache, with and without row padding -----------------------------------
PROBE_SHAPE = (1536, 256)  # (out, in): the toy generator's gate/up projection, a linear that runs on oneDNN


def memory_probe(args, out: Path) -> int:
    """RSS of a fresh process after `--memory-probe-steps` linears of random row counts (1..2048), unpadded and
    padded: oneDNN JIT-compiles and keeps a primitive per distinct row count, row padding bounds the counts."""
    runs = {}
    for mode in ("unpadded", "padded"):
        command = [sys.executable, __file__, "--memory-probe-run", mode, "--memory-probe-steps",
                   str(args.memory_probe_steps), "--seed", str(args.seed)]
        if args.threads:
            command += ["--threads", str(args.threads)]
        done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, check=True)
        runs[mode] = json.loads(done.stdout.strip().splitlines()[-1])
        print(mode, json.dumps(runs[mode]), flush=True)
    report = {"command": "python benchmarks/soak.py " + " ".join(sys.argv[1:]),
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": machine(), "runs": runs}
    (out / "memory_probe.json").write_text(json.dumps(report, indent=1))
    return 0


def memory_probe_run(args) -> None:
    import torch

    from specscale.model.linear import Linear
    from specscale.model.row_padding import padded_rows

    torch.set_num_threads(args.threads or 2)
    linear = Linear(PROBE_SHAPE[1], PROBE_SHAPE[0], bias=False).to(torch.bfloat16)
    if "onednn" not in linear.paths():
        print(json.dumps({"skipped": "oneDNN does not run bf16 linears on this CPU"}))
        return
    linear.prepack("onednn")
    linear.pad_rows = args.memory_probe_run == "padded"
    rng = random.Random(args.seed)
    series, rows_seen = [], set()
    for step in range(args.memory_probe_steps + 1):
        if step % max(args.memory_probe_steps // 10, 1) == 0:
            series.append((step, process_sample(os.getpid())["rss_mib"]))
        rows = rng.randint(1, 2048)
        rows_seen.add(padded_rows(rows) if linear.pad_rows else rows)
        linear(torch.randn(rows, PROBE_SHAPE[1], dtype=torch.bfloat16))
    print(json.dumps({"rss_mib_start": series[0][1], "rss_mib_end": series[-1][1], "distinct_row_counts_run":
                      len(rows_seen), "rss_mib_by_step": series}))


# ---- main ----------------------------------------------------------------------------------------------------------
async def soak(args, url: str, pid: int) -> dict:
    async with httpx.AsyncClient(base_url=url, timeout=900, limits=httpx.Limits(max_connections=512)) as http:
        model = (await http.get("/v1/models")).json()["data"][0]["id"]
        load = Load(url, model, [p.question for p in toy_problems("test", 200, seed=args.seed)])
        pool = httpx.AsyncClient(limits=httpx.Limits(max_connections=512), timeout=900)
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=900, http_client=pool)
        capacity = None if args.rate else await measure_capacity(load, client, args)
        rate = args.rate or args.load * capacity
        print(f"capacity {capacity or 0:.2f} req/s; offering {rate:.2f} req/s for {args.minutes:g} min", flush=True)
        baseline, fives = await server_counts(http)
        idle_health = (await http.get("/health")).json()
        idle = {"kv_blocks_used": idle_health["kv_blocks_used"], "server_5xx": fives}
        load.records.clear()
        load.sent = 0
        load.started = time.monotonic()
        samples, drains = await run_load(load, client, http, pid, args, rate, baseline, idle)
        await client.close()
    warmup_s = 60 * (args.warmup_minutes if args.warmup_minutes is not None else min(args.minutes / 5, 10))
    records = [asdict(r) for r in load.records]
    return {"minutes": args.minutes, "sample_s": args.sample_s, "capacity_rps": capacity, "rate_rps": rate,
            "sent": load.sent, "requests_by_kind": dict(Counter(r.kind.split(":")[0] for r in load.records)),
            "outcomes": dict(Counter(r.outcome for r in load.records)), "idle": idle,
            "client_5xx": sum(1 for r in load.records if r.status >= 500),
            "samples": samples, "drains": drains, "records": records,
            "verdict": verdict(samples, drains, load, idle, args, warmup_s)}


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.memory_probe_run:
        memory_probe_run(args)
        return 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped soak still stops its server
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.memory_probe:
        return memory_probe(args, out)
    process, url = start_server(args, out / "server.log")
    try:
        report = asyncio.run(soak(args, url, process.pid))
    finally:
        process.terminate()
        process.wait(timeout=120)
    report |= {"command": "python benchmarks/soak.py " + " ".join(argv if argv is not None else sys.argv[1:]),
               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": machine(),
               "server_exit_code": process.returncode}
    (out / "raw.json").write_text(json.dumps({"records": report.pop("records")}))  # per request: not committed
    (out / "soak.json").write_text(json.dumps(report, indent=1))
    write_markdown(report, out / "soak.md")
    plot(report, out / "soak.png")
    print((out / "soak.md").read_text())
    return 0 if report["verdict"]["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
