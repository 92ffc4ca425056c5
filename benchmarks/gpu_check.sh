#!/usr/bin/env bash
# The GPU check of docs/gpu.md: engine decode against transformers on 1.5B- and 7B-shaped random checkpoints,
# PRM prefill throughput on a Qwen2.5-Math-PRM-7B-shaped one, and a short search ladder, on one CUDA GPU.
# Sized for under 8 minutes on one A100 / H100 / H200 (an estimate: this script has NOT been run on a GPU yet).
# Needs ~40 GB of disk for the checkpoints (cached under ~/.cache/specscale/random-checkpoints) and ~40 GB
# of GPU memory. Output: results/gpu-check/ (logs, bench JSON + Markdown) and the engine table in
# docs/BENCHMARKS.md (section engine-throughput-real-cuda).
#
#     benchmarks/gpu_check.sh            # from the repository root, with the project installed
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=results/gpu-check
mkdir -p "$OUT"
PY=${PYTHON:-python}
step() { echo "== $(date +%H:%M:%S) $*" | tee -a "$OUT/steps.log"; }

step "random checkpoints (drawn on the GPU; cached after the first run)"
"$PY" benchmarks/random_checkpoint.py 1.5b 7b 7b-prm --device cuda | tee "$OUT/checkpoints.txt"
GEN_15B=$(sed -n 1p "$OUT/checkpoints.txt")
PRM_7B=$(sed -n 3p "$OUT/checkpoints.txt")

step "engine decode vs transformers, 1.5B and 7B shapes, bf16 (about 3 min)"
timeout 300 "$PY" benchmarks/engine_throughput.py --device cuda --shapes 1.5b 7b --dtypes bfloat16 \
    --batch-sizes 1 8 32 64 --new-tokens 32 --repeats 2 --kv-gb 8 --skip-vllm \
    --write docs/BENCHMARKS.md 2>&1 | tee "$OUT/engine_throughput.log"

step "PRM prefill throughput, Qwen2.5-Math-PRM-7B shape (about 1 min)"
timeout 180 specscale profile-prm --model "$PRM_7B" --device cuda --repeats 3 \
    --batch-tokens 1024,4096,16384 --out "$OUT/profile-prm.json" 2>&1 | tee "$OUT/profile-prm.log"

step "short search ladder: beam, ep+cd, specscale on 8 MATH-500 problems, 1.5B generator + 7B PRM (about 2 min)"
# Random weights never write "\n\n", so every step runs to --max-step-tokens: 64 keeps the searches short.
timeout 240 specscale eval --dataset math500 --problems 8 --device cuda --generator "$GEN_15B" --prm "$PRM_7B" \
    --preset beam,ep+cd,specscale --beam-size 8 --max-rounds 4 --max-step-tokens 64 \
    --out "$OUT/eval-ladder" 2>&1 | tee "$OUT/eval-ladder.log"

step "done: $OUT"
