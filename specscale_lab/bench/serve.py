"""`specscale bench serve`: open-loop load against a running `specscale serve`, like `vllm bench serve`.

Requests arrive as a gamma process: inter-arrival times are Gamma(shape=burstiness, scale=1/(rate *
burstiness)), so the mean rate is `--rate` for any burstiness; burstiness 1 is a Poisson process, below 1
burstier, above 1 more regular; `--rate inf` sends everything at once. Each request is a chat completion
of a held-out toy question with the chosen preset. The report: request and output-token throughput
(output = completion tokens of the answered requests), end-to-end latency percentiles, normalized latency
(end-to-end / completion tokens, docs/BENCHMARKS.md) and errors by HTTP status; written as JSON and a Markdown table.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
import numpy as np

PERCENTILES = (50, 90, 99)


@dataclass
class RequestRecord:
    index: int
    sent_s: float  # since the benchmark started
    latency_s: float
    status: int | None  # None: no HTTP answer (connection error, client timeout)
    completion_tokens: int = 0
    generated_tokens: int = 0
    error: str | None = None


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("serve", help="Poisson / gamma load against a running `specscale serve`")
    p.add_argument("--url", default="http://127.0.0.1:8000", help="the server's base URL")
    p.add_argument("--rate", type=float, default=math.inf, help="requests per second (inf: all at once)")
    p.add_argument("--burstiness", type=float, default=1.0, help="gamma shape: 1 Poisson, <1 burstier")
    p.add_argument("--num-requests", type=int, default=100)
    p.add_argument("--preset", default=None, help="search preset (default: the server's)")
    p.add_argument("--beam-size", type=int, default=None)
    p.add_argument("--beam-width", type=int, default=None)
    p.add_argument("--max-rounds", type=int, default=None)
    p.add_argument("--max-tokens", type=int, default=None, help="tokens per step")
    p.add_argument("--temperature", type=float, default=None)
    p.add_argument("--model", default=None, help="model id (default: the server's first)")
    p.add_argument("--api-key", default=None)
    p.add_argument("--timeout", type=float, default=600.0, help="client timeout per request (s)")
    p.add_argument("--seed", type=int, default=0, help="arrival times and question choice")
    p.add_argument("--out", default=None, help="folder for serve.json and serve.md (default: print only)")
    p.set_defaults(func=run)


def run(args) -> int:
    if args.rate <= 0 or args.burstiness <= 0 or args.num_requests < 1:
        raise SystemExit("--rate and --burstiness must be positive and --num-requests >= 1")
    report = asyncio.run(benchmark(args))
    print(markdown(report))
    if args.out:
        write_report(report, Path(args.out))
        print(f"wrote {Path(args.out) / 'serve.json'} and {Path(args.out) / 'serve.md'}")
    return 0


# ---- load --------------------------------------------------------------------------------------------
def arrival_times(num_requests: int, rate: float, burstiness: float, seed: int) -> list[float]:
    """Send times in seconds from the start: cumulative gamma inter-arrivals with mean 1 / rate."""
    if math.isinf(rate):
        return [0.0] * num_requests
    gaps = np.random.default_rng(seed).gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=num_requests)
    return np.cumsum(gaps).tolist()


def questions(num_requests: int, seed: int) -> list[str]:
    from specscale_lab.tasks.toy import toy_problems

    return [p.question for p in toy_problems("test", num_requests, seed=seed)]


def request_body(args, model: str, question: str, index: int) -> dict:
    search = {"preset": args.preset, "beam_size": args.beam_size, "beam_width": args.beam_width,
              "max_rounds": args.max_rounds}
    body = {"model": model, "messages": [{"role": "user", "content": question}], "seed": args.seed * 100_003 + index,
            "search": {k: v for k, v in search.items() if v is not None}}
    if args.max_tokens is not None:
        body["max_tokens"] = args.max_tokens
    if args.temperature is not None:
        body["temperature"] = args.temperature
    return body


async def benchmark(args) -> dict:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    limits = httpx.Limits(max_connections=args.num_requests, max_keepalive_connections=args.num_requests)
    async with httpx.AsyncClient(base_url=args.url, headers=headers, timeout=args.timeout, limits=limits) as client:
        model = args.model or await served_model(client)
        times = arrival_times(args.num_requests, args.rate, args.burstiness, args.seed)
        prompts = questions(args.num_requests, args.seed)
        start = time.perf_counter()
        tasks = [asyncio.create_task(send(client, request_body(args, model, q, i), i, t, start))
                 for i, (q, t) in enumerate(zip(prompts, times, strict=True))]
        records = await asyncio.gather(*tasks)
        duration = time.perf_counter() - start
    return {"config": config_of(args, model), "summary": summarize(records, duration),
            "requests": [asdict(r) for r in records]}


async def served_model(client) -> str:
    response = await client.get("/v1/models")
    response.raise_for_status()
    return response.json()["data"][0]["id"]


async def send(client, body: dict, index: int, send_at: float, start: float) -> RequestRecord:
    await asyncio.sleep(max(start + send_at - time.perf_counter(), 0.0))
    sent = time.perf_counter()
    try:
        response = await client.post("/v1/chat/completions", json=body)
    except httpx.HTTPError as error:  # connection refused / reset, client timeout: recorded, not fatal
        return RequestRecord(index, sent - start, time.perf_counter() - sent, None, error=type(error).__name__)
    latency = time.perf_counter() - sent
    payload = _json_or_empty(response)
    if response.status_code != 200:
        message = payload.get("error", {}).get("message") if isinstance(payload.get("error"), dict) else None
        return RequestRecord(index, sent - start, latency, response.status_code, error=message or response.text[:200])
    usage = payload.get("usage", {})
    return RequestRecord(index, sent - start, latency, 200, usage.get("completion_tokens", 0),
                         usage.get("generated_tokens", 0))


def _json_or_empty(response) -> dict:
    try:
        payload = response.json()
    except ValueError:
        return {}
    return payload if isinstance(payload, dict) else {}


# ---- report --------------------------------------------------------------------------------------------
def config_of(args, model: str) -> dict:
    rate = args.rate if math.isfinite(args.rate) else "inf"
    return {"url": args.url, "model": model, "rate": rate, "burstiness": args.burstiness,
            "num_requests": args.num_requests, "preset": args.preset, "beam_size": args.beam_size,
            "beam_width": args.beam_width, "max_rounds": args.max_rounds, "max_tokens": args.max_tokens,
            "temperature": args.temperature, "seed": args.seed}


def summarize(records: list[RequestRecord], duration_s: float) -> dict:
    ok = [r for r in records if r.status == 200]
    errors: dict[str, int] = {}
    for r in records:
        if r.status != 200:
            key = str(r.status) if r.status is not None else f"no response ({r.error})"
            errors[key] = errors.get(key, 0) + 1
    completion = sum(r.completion_tokens for r in ok)
    latencies = [r.latency_s for r in ok]
    normalized = [r.latency_s / r.completion_tokens for r in ok if r.completion_tokens > 0]
    return {
        "duration_s": duration_s, "requests": len(records), "completed": len(ok), "errors_by_status": errors,
        "request_throughput": len(ok) / duration_s, "output_tokens_per_s": completion / duration_s,
        "generated_tokens_per_s": sum(r.generated_tokens for r in ok) / duration_s,
        "completion_tokens": completion,
        "latency_s": distribution(latencies), "normalized_latency_s_per_token": distribution(normalized),
    }


def distribution(values: list[float]) -> dict:
    if not values:
        return {"mean": None, **{f"p{q}": None for q in PERCENTILES}}
    return {"mean": float(np.mean(values)), **{f"p{q}": float(np.percentile(values, q)) for q in PERCENTILES}}


def markdown(report: dict) -> str:
    c, s = report["config"], report["summary"]
    errors = ", ".join(f"{status}: {count}" for status, count in sorted(s["errors_by_status"].items())) or "none"
    rows = [
        ("requests sent / answered 200", f"{s['requests']} / {s['completed']}"),
        ("errors by status", errors),
        ("duration", f"{s['duration_s']:.2f} s"),
        ("request throughput", f"{s['request_throughput']:.2f} req/s"),
        ("output tokens/s (returned paths)", f"{s['output_tokens_per_s']:.1f}"),
        ("generated tokens/s", f"{s['generated_tokens_per_s']:.1f}"),
    ]
    for q in ("mean", *[f"p{p}" for p in PERCENTILES]):
        rows.append((f"latency {q}", _seconds(s["latency_s"][q])))
    for q in ("mean", *[f"p{p}" for p in PERCENTILES]):
        value = s["normalized_latency_s_per_token"][q]
        rows.append((f"normalized latency {q}", "n/a" if value is None else f"{value * 1000:.1f} ms/token"))
    title = (f"## bench serve: {c['model']} at {c['url']}, preset {c['preset'] or 'server default'}, "
             f"rate {c['rate']} req/s, burstiness {c['burstiness']:g}")
    table = "\n".join(f"| {name} | {value} |" for name, value in rows)
    return f"{title}\n\n| metric | value |\n| --- | --- |\n{table}\n"


def _seconds(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f} s"


def write_report(report: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "serve.json").write_text(json.dumps(report, indent=2, default=str))
    (out / "serve.md").write_text(markdown(report))
