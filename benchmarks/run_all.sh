#!/usr/bin/env bash
# The full `specscale bench` suite: the exact commands behind the "Results" section of docs/bench/eval-suite.md.
#
#   benchmarks/run_all.sh            # full runs into docs/bench/<sub-command>/ (about 1 to 1.5 hours)
#   benchmarks/run_all.sh --quick    # the same commands in quick mode (a few minutes)
#
# Needs the bundled toy models (specscale/assets/toy-generator, toy-prm) and a quiet machine: timings
# taken while another process is busy are worthless on a 2-core CPU (torch's threads fight it). The
# script refuses to start when other processes keep more than 15% of the CPUs busy, unless FORCE=1.
# Environment: OUT (default docs/bench), THREADS (torch threads, default 2), FORCE.
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=${OUT:-docs/bench}
THREADS=${THREADS:-2}
MODE=("$@")

busy=$(python -c "from specscale_lab.bench.common import other_cpu_busy; print(f'{other_cpu_busy():.2f}')")
if [[ "${FORCE:-0}" != 1 ]] && awk -v b="$busy" 'BEGIN { exit !(b > 0.15) }'; then
    echo "other processes keep $busy of the CPUs busy: wait, or set FORCE=1 to measure anyway" >&2
    exit 1
fi

# The lazy-verification threshold every run below uses: the toy PRM's knee on this machine.
mkdir -p "$OUT"
specscale profile-prm --threads "$THREADS" | tee "$OUT/profile-prm.md"

specscale bench throughput   --out "$OUT/throughput"   --threads "$THREADS" "${MODE[@]}"
specscale bench latency      --out "$OUT/latency"      --threads "$THREADS" "${MODE[@]}"
specscale bench characterize --out "$OUT/characterize" --threads "$THREADS" "${MODE[@]}"
specscale bench sweep-lv     --out "$OUT/sweep-lv"     --threads "$THREADS" "${MODE[@]}"
specscale bench scaling      --out "$OUT/scaling"      --threads "$THREADS" "${MODE[@]}"
# Accuracy does not depend on timing; it is the longest run (300 problems x 3 seeds x 10 configurations).
specscale bench accuracy     --out "$OUT/accuracy"     --threads "$THREADS" "${MODE[@]}"
