"""`specscale generate`: completions with the engine alone (a quick demo of the engine; default: toy problems)."""

from __future__ import annotations

import time

from specscale.config import KERNEL_MODES
from specscale.defaults import TOY_GENERATOR
from specscale.prompts import TOY_GENERATOR_SYSTEM_PROMPT, chat_messages
from specscale_lab.cli_checks import check_model_folder
from specscale_lab.tasks.toy import toy_problems


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
    p.add_argument("--kernels", default="auto", choices=KERNEL_MODES, help="CPU linear kernels: auto (the fastest measured on this machine), or force ours / onednn / transposed / torch")
    p.add_argument("--system", default=None, help="system prompt (default: the toy generator's)")
    p.set_defaults(func=run_generate)


def default_prompts(n: int) -> list[str]:
    return [problem.question for problem in toy_problems("test", n, seed=0)]


def run_generate(args) -> int:
    from specscale.config import EngineConfig
    from specscale.engine.engine import Engine
    from specscale.seam import SamplingParams

    check_model_folder("--model", args.model)
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
