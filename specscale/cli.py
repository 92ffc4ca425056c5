"""Command line: `specscale <command>`. Each command lives in its own module; this file only dispatches."""

from __future__ import annotations

import argparse
import sys
import time

from specscale.bench import add_bench
from specscale.config import KERNEL_MODES
from specscale.defaults import TOY_GENERATOR
from specscale.evaluation.command import add_eval
from specscale.prompts import TOY_GENERATOR_SYSTEM_PROMPT, chat_messages
from specscale.record_trace import add_trace
from specscale.serve import add_serve
from specscale.simulate import add_simulate
from specscale.solve import add_solve


def add_generate(sub) -> None:
    p = sub.add_parser("generate", help="generate completions with the engine (a quick demo of the engine)")
    p.add_argument("--model", default=str(TOY_GENERATOR), help="local Hugging Face folder")
    p.add_argument("--prompt", action="append", help="user message (repeatable); default: toy problems")
    p.add_argument("--num-prompts", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--kernels", default="auto", choices=KERNEL_MODES, help="CPU linear kernels: auto (the fastest measured on this machine), or force ours / onednn / torch")
    p.add_argument("--system", default=None, help="system prompt (default: the toy generator's)")
    p.set_defaults(func=run_generate)


def default_prompts(n: int) -> list[str]:
    from specscale.tasks.toy import toy_problems

    return [problem.question for problem in toy_problems("test", n, seed=0)]


def run_generate(args) -> int:
    from specscale.config import EngineConfig
    from specscale.engine.engine import Engine
    from specscale.engine.sequence import SamplingParams

    engine = Engine(EngineConfig(model=args.model, dtype=args.dtype, device=args.device, kernels=args.kernels))
    tok = engine.tokenizer
    questions = args.prompt or default_prompts(args.num_prompts)
    ids = {}
    for i, question in enumerate(questions):
        text = tok.apply_chat_template(chat_messages(question, args.system or TOY_GENERATOR_SYSTEM_PROMPT),
                                       add_generation_prompt=True)
        params = SamplingParams(temperature=args.temperature, max_new_tokens=args.max_new_tokens, seed=args.seed + i)
        ids[engine.add(tok.encode(text), params)] = question
    generated: dict[int, list[int]] = {seq_id: [] for seq_id in ids}
    start = time.perf_counter()
    while engine.has_work():
        for out in engine.step():
            generated[out.seq_id] += out.new_token_ids
    elapsed = time.perf_counter() - start
    for seq_id, question in ids.items():
        print(f"### {question}\n{tok.decode(generated[seq_id])}\n")
    total = sum(len(t) for t in generated.values())
    print(f"{len(ids)} completions, {total} tokens in {elapsed:.2f} s ({total / elapsed:.0f} tokens/s)")
    return 0


def add_profile_prm(sub) -> None:
    p = sub.add_parser("profile-prm", help="PRM input-token throughput vs batch size; records the "
                       "lazy-verification threshold (the knee) for this model and device")
    p.add_argument("--model", default=None, help="local PRM folder (default: the bundled toy PRM)")
    p.add_argument("--out", default=None, help="JSON file (default: ~/.cache/specscale/prm-profiles/, "
                   "keyed by model and device, where the search looks)")
    p.add_argument("--plot", default=None, help="PNG plot (default: next to the JSON file)")
    p.add_argument("--batch-tokens", default=None, help="comma-separated (default: 256,512,...,8192)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--context-tokens", type=int, default=512, help="cached context each sequence extends")
    p.add_argument("--step-tokens", type=int, default=128, help="new tokens per sequence")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--quick", action="store_true", help="tiny batches, 2 repeats (a smoke test)")
    p.set_defaults(func=run_profile_prm)


def run_profile_prm(args) -> int:
    from specscale.verify.profile import run_profile_prm as run

    return run(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specscale", description="PRM-guided test-time scaling server")
    sub = parser.add_subparsers(dest="command", required=True)
    add_generate(sub)
    add_solve(sub)
    add_bench(sub)
    add_eval(sub)
    add_profile_prm(sub)
    add_serve(sub)
    add_simulate(sub)
    add_trace(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
