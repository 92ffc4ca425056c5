"""What the simulator's roofline (specscale/costmodel/cost.py) charges, measured on one CUDA GPU.

The simulated ladders rest on a hardware profile (specscale/costmodel/data/hardware/*.json) whose efficiencies
and fixed costs were datasheet figures and assumptions. This probe measures them on the device itself, for
a model's real shape with random bf16 weights (no checkpoint, no download; needs only torch):

    ceilings   a bf16 8192^3 matrix product (FLOP/s) and a device-to-device copy (bytes/s)
    gemm       each linear of the model (qkv, o, gate_up, down, LM head) at 1..16,384 rows, timed as CUDA
               graph replays over enough weight copies that no weight stays in L2: the rows' efficiency
               curve (compute_efficiency, gemm_half_wave) and the weight-streaming bandwidth
    decode     the whole body + LM head for B decode rows at context C (flash attention over a contiguous
               KV cache, the new token's K/V written), replayed as one CUDA graph (GPU time only, what a
               vLLM-class engine with CUDA graphs pays per decode iteration besides its host work), and the
               same forward launched eagerly (host launches not hidden: the eager engine's cost)
    prefill    a PRM call: S sequences of L new tokens over a cached prefix of P tokens, body + score head
               on each sequence's last token, eager (what an eager prefill pays, host launches and the
               scores' copy to the host included) and graph-replayed (GPU time only)
    compiled   (--compiled) a few decode iterations and PRM calls again with each layer through
               torch.compile (its elementwise kernels fused, as vLLM's V1 engine compiles its models),
               graph-replayed: how much of the per-layer kernel time a fusing engine saves

Attention in prefill attends every new token to all P + L keys (no causal mask inside the new tokens, so
that SDPA takes its flash kernel): at most L / (2 (P + L)) more attention FLOPs, under 1% of the call's.
Writes one JSON (--out); benchmarks/gpu_cost_fit.py compares it with the roofline and fits the profile.

    python benchmarks/gpu_cost_probe.py --out $OUT/probe.json                 # on the GPU, ~2 min
    python benchmarks/gpu_cost_probe.py --device cpu --tiny --out /tmp/p.json  # a dry run of the code paths
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

MODELS = Path(__file__).resolve().parent.parent / "specscale" / "sim" / "data" / "models"
L2_FLUSH_BYTES = 256 * 2**20  # weight copies cycled per GEMM timing: several times the H100/H200's 50-60 MB L2
GEMM_ROWS = (1, 8, 16, 32, 64, 96, 128, 192, 256, 384, 512, 1024, 2048, 4096, 8192, 16384)
DECODE_ROWS = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 512)


@dataclass(frozen=True)
class Shape:
    name: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @classmethod
    def from_config(cls, name: str) -> Shape:
        config = json.loads((MODELS / name / "config.json").read_text())
        return cls(name, config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"],
                   config["num_attention_heads"], config["num_key_value_heads"], config["vocab_size"])


TINY = Shape("tiny", hidden=256, intermediate=512, layers=2, heads=4, kv_heads=2, vocab=1000)


class Timer:
    """Median seconds of a callable: CUDA events around graph replays (GPU time), or a synchronised host
    clock around eager calls (host launches included). On the CPU (dry runs) both are the host clock."""

    def __init__(self, device: torch.device, replays: int):
        self.device, self.replays = device, replays

    def eager(self, fn) -> float:
        fn(), fn()  # warm-up: kernels chosen, workspaces allocated
        samples = []
        for _ in range(self.replays):
            self.sync()
            start = time.perf_counter()
            fn()
            self.sync()
            samples.append(time.perf_counter() - start)
        return statistics.median(samples)

    def graph(self, fn) -> float:
        if self.device.type != "cuda":
            return self.eager(fn)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm-up off the default stream, as graph capture requires
            fn(), fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        graph.replay()
        samples = []
        for _ in range(self.replays):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 1e3)
        del graph
        torch.cuda.empty_cache()  # the graph's private pool back to the device before the next size
        return statistics.median(samples)

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()


def randn(*shape: int, device: torch.device) -> torch.Tensor:
    return torch.empty(*shape, dtype=torch.bfloat16, device=device).normal_(0.0, 0.02)


class Body:
    """A Qwen2 decoder's weights (q/k/v with bias, SwiGLU MLP, RMSNorm) with random values, its LM head and a
    PRM's score head (Linear(h, h) + ReLU + Linear(h, 2)), and a flat KV buffer per layer of `kv_elements`."""

    def __init__(self, shape: Shape, kv_elements: int, device: torch.device):
        h, d = shape.hidden, shape.head_dim
        qkv = (shape.heads + 2 * shape.kv_heads) * d
        self.shape, self.device = shape, device
        self.layers = [dict(qkv=randn(qkv, h, device=device), qkv_bias=randn(qkv, device=device),
                            o=randn(h, shape.heads * d, device=device),
                            gate_up=randn(2 * shape.intermediate, h, device=device),
                            down=randn(h, shape.intermediate, device=device),
                            norm1=torch.ones(h, dtype=torch.bfloat16, device=device),
                            norm2=torch.ones(h, dtype=torch.bfloat16, device=device),
                            k=randn(kv_elements, device=device), v=randn(kv_elements, device=device))
                       for _ in range(shape.layers)]
        self.final_norm = torch.ones(h, dtype=torch.bfloat16, device=device)
        self.lm_head = randn(shape.vocab, h, device=device)
        self.score = (randn(h, h, device=device), randn(2, h, device=device))

    def layer(self, w: dict, x: torch.Tensor, batch: int, new: int, cached: int) -> torch.Tensor:
        """x [batch*new, h]: `batch` sequences of `new` tokens after `cached` cached ones -> [batch*new, h]."""
        s, d = self.shape, self.shape.head_dim
        keys = cached + new
        k_cache = w["k"][: batch * s.kv_heads * keys * d].view(batch, s.kv_heads, keys, d)
        v_cache = w["v"][: batch * s.kv_heads * keys * d].view(batch, s.kv_heads, keys, d)
        qkv = F.linear(F.rms_norm(x, (s.hidden,), w["norm1"]), w["qkv"], w["qkv_bias"])  # [T, (H + 2 KVH) d]
        q, k, v = qkv.split((s.heads * d, s.kv_heads * d, s.kv_heads * d), dim=-1)
        q, k = rotate(q.view(batch, new, s.heads, d)), rotate(k.view(batch, new, s.kv_heads, d))
        k_cache[:, :, cached:] = k.transpose(1, 2)  # the new tokens' K/V into the cache: [B, KVH, new, d]
        v_cache[:, :, cached:] = v.view(batch, new, s.kv_heads, d).transpose(1, 2)
        x = x + F.linear(grouped_attention(q, k_cache, v_cache).reshape(batch * new, s.heads * d), w["o"])
        gate, up = F.linear(F.rms_norm(x, (s.hidden,), w["norm2"]), w["gate_up"]).chunk(2, dim=-1)
        return x + F.linear(F.silu(gate) * up, w["down"])

    def forward(self, x: torch.Tensor, batch: int, new: int, cached: int, head: str) -> torch.Tensor:
        for w in self.layers:
            x = self.layer(w, x, batch, new, cached)
        last = F.rms_norm(x.view(batch, new, -1)[:, -1], (self.shape.hidden,), self.final_norm)  # [B, h]
        if head == "lm":
            return F.linear(last, self.lm_head)  # [B, V] logits
        return F.linear(F.relu(F.linear(last, self.score[0])), self.score[1])  # [B, 2] step scores


def grouped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """q [B, L, H, d] over k/v [B, KVH, S, d] -> [B, L, H, d], every query attending every key. The g = H / KVH
    query heads of one KV head are folded into the query axis (exact without a mask), so that SDPA runs its
    flash kernel on plain multi-head shapes, with no GQA support needed and no K/V copied per query head."""
    b, length, heads, d = q.shape
    kv_heads = k.shape[1]
    g = heads // kv_heads
    folded = q.view(b, length, kv_heads, g, d).permute(0, 2, 3, 1, 4).reshape(b, kv_heads, g * length, d)
    out = F.scaled_dot_product_attention(folded, k, v)  # [B, KVH, g * L, d]
    return out.view(b, kv_heads, g, length, d).permute(0, 3, 1, 2, 4).reshape(b, length, heads, d)


def rotate(x: torch.Tensor) -> torch.Tensor:
    """RoPE's arithmetic on [B, L, heads, d] (a fixed angle: the cost, not the positions, is measured)."""
    half = x.shape[-1] // 2
    return x * 0.9 + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * 0.1


def ceilings(timer: Timer, device: torch.device, tiny: bool) -> dict:
    n = 256 if tiny else 8192
    a, b = randn(n, n, device=device), randn(n, n, device=device)
    matmul_s = timer.graph(lambda: a @ b)
    src = torch.empty(2**20 if tiny else 2**31, dtype=torch.bfloat16, device=device)  # 4 GiB on the GPU
    dst = torch.empty_like(src)
    copy_s = timer.graph(lambda: dst.copy_(src))
    return {"matmul_flops": 2 * n**3 / matmul_s, "copy_bytes_per_s": 2 * src.numel() * 2 / copy_s}


def gemm_sweep(shape: Shape, timer: Timer, device: torch.device, rows: tuple[int, ...]) -> list[dict]:
    h, d = shape.hidden, shape.head_dim
    linears = {"qkv": (h, (shape.heads + 2 * shape.kv_heads) * d), "o": (shape.heads * d, h),
               "gate_up": (h, 2 * shape.intermediate), "down": (shape.intermediate, h), "lm_head": (h, shape.vocab)}
    results = []
    for name, (k, n) in linears.items():
        copies = max(1, math.ceil(L2_FLUSH_BYTES / (2 * k * n)))
        weights = [randn(n, k, device=device) for _ in range(copies)]
        calls = max(copies, 8)
        for m in rows:
            if name == "lm_head" and m > 1024:  # a head runs on decode rows only
                break
            x = randn(m, k, device=device)
            seconds = timer.graph(partial(linear_calls, x, weights, calls)) / calls
            results.append({"linear": name, "rows": m, "in": k, "out": n, "seconds": seconds})
        del weights
    return results


def linear_calls(x: torch.Tensor, weights: list[torch.Tensor], calls: int) -> list[torch.Tensor]:
    return [F.linear(x, weights[i % len(weights)]) for i in range(calls)]


def read_out(call) -> torch.Tensor:
    return call().float().cpu()


def decode_sweep(body: Body, timer: Timer, points: list[tuple[int, int]], eager_rows: set[int]) -> list[dict]:
    results = []
    for rows, context in points:
        x = randn(rows, body.shape.hidden, device=body.device)
        step = partial(body.forward, x, rows, 1, context - 1, "lm")  # one decode iteration
        record = {"rows": rows, "context": context, "graph_s": timer.graph(step)}
        if rows in eager_rows:
            record["eager_s"] = timer.eager(step)
        results.append(record)
        print(f"decode {body.shape.name} rows {rows:4d} context {context:5d}: {record}", flush=True)
    return results


def prefill_sweep(body: Body, timer: Timer, points: list[tuple[int, int, int]]) -> list[dict]:
    results = []
    for sequences, new, cached in points:
        x = randn(sequences * new, body.shape.hidden, device=body.device)
        call = partial(body.forward, x, sequences, new, cached, "score")  # one PRM call
        eager = partial(read_out, call)  # the call and its scores' copy to the host
        record = {"sequences": sequences, "new": new, "cached": cached, "tokens": sequences * new,
                  "graph_s": timer.graph(call), "eager_s": timer.eager(eager)}
        results.append(record)
        print(f"prefill {body.shape.name}: {record}", flush=True)
    return results


def compiled_sweeps(body: Body, timer: Timer, model: dict, tiny: bool) -> None:
    """The decode and PRM sweeps again, a few points each, with each layer compiled (dynamic shapes: one
    compilation serves every batch)."""
    import torch._dynamo

    torch._dynamo.config.cache_size_limit = 64
    body.layer = torch.compile(body.layer, dynamic=True)
    points = [(b, 1024) for b in ((1, 8) if tiny else (1, 16, 64, 128, 256, 512))]
    model["decode_compiled"] = decode_sweep(body, timer, points, eager_rows=set())
    calls = [(t // 128, 128, 512) for t in ((128, 256) if tiny else (128, 512, 2048, 8192))]
    model["prefill_compiled"] = prefill_sweep(body, timer, calls)


def device_facts(device: torch.device) -> dict:
    facts = {"torch": torch.__version__, "device": str(device)}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        facts |= {"name": props.name, "multiprocessors": props.multi_processor_count,
                  "memory_bytes": props.total_memory, "cuda": torch.version.cuda}
    return facts


def run(args: argparse.Namespace) -> dict:
    device = torch.device(args.device)
    timer = Timer(device, 3 if args.tiny else args.replays)
    report = {"facts": device_facts(device), "ceilings": ceilings(timer, device, args.tiny), "models": {}}
    print(json.dumps(report, indent=1), flush=True)
    for index, name in enumerate(args.shapes):
        shape = TINY if args.tiny else Shape.from_config(name)
        gemm_rows = GEMM_ROWS[:5] if args.tiny else GEMM_ROWS
        decode_rows = DECODE_ROWS[:4] if args.tiny else DECODE_ROWS
        primary = index == 0  # the full sweep on the first shape, a short one on the others
        points = [(b, 1024) for b in decode_rows if primary or b in (1, 16, 64, 128, 256, 512)]
        if primary:
            points += [(b, 256) for b in (1, 64, 256)] + [(b, 4096) for b in (1, 64, 128)]
        elements = max(b * c for b, c in points) * shape.kv_heads * shape.head_dim
        body = Body(shape, max(elements, 128 * 640 * shape.kv_heads * shape.head_dim), device)
        model = {"shape": asdict(shape), "gemm": gemm_sweep(shape, timer, device, gemm_rows)}
        model["decode"] = decode_sweep(body, timer, points, eager_rows={1, 64, 256})
        if primary:  # the PRM: tokens per call 128..16,384 as 128-token steps over a 512-token cached prefix
            calls = [(t // 128, 128, 512) for t in (128, 256, 512, 1024, 2048, 4096, 8192, 16384)]
            calls += [(32, 64, 1024), (8, 256, 256)]  # the same 2,048 tokens split otherwise
            model["prefill"] = prefill_sweep(body, timer, calls[:3] if args.tiny else calls)
        if primary and args.compiled:
            try:  # an optional extra: a compiler failure on the device must not lose the sweeps above
                compiled_sweeps(body, timer, model, args.tiny)
            except Exception as error:  # noqa: BLE001 - reported in the JSON instead
                model["compiled_error"] = repr(error)
        report["models"][shape.name] = model
        del body
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--shapes", nargs="+", default=["qwen2.5-7b-instruct", "qwen2.5-3b-instruct"],
                        help="model folders under specscale/costmodel/data/models; the first gets the full sweep "
                             "and the PRM calls (Qwen2.5-Math-PRM-7B's body is Qwen2.5-7B's)")
    parser.add_argument("--replays", type=int, default=20)
    parser.add_argument("--compiled", action="store_true", help="also time torch.compile'd layers")
    parser.add_argument("--tiny", action="store_true", help="a 2-layer toy shape: a dry run of the code paths")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    started = time.time()
    report = run(args)
    report["wall_s"] = time.time() - started
    args.out.write_text(json.dumps(report, indent=1))
    print(f"wrote {args.out} in {report['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
