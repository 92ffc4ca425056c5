#!/usr/bin/env bash
# The full `specscale bench` suite: the exact commands behind the "Results" section of docs/bench/eval-suite.md.
#
#   benchmarks/run_all.sh                  # full runs into results/bench/<sub-command>/ (about 1 to 1.5 hours)
#   benchmarks/run_all.sh --quick          # the same commands in quick mode (a few minutes)
#   UPDATE_DOCS=1 benchmarks/run_all.sh    # into docs/bench/, replacing the committed results
#
# Needs the bundled toy models (specscale/assets/toy-generator, toy-prm) and a quiet machine: timings
# taken while another process is busy are worthless on a 2-core CPU (torch's threads fight it). The
# script refuses to start while another benchmark runs, or while other processes keep more than 15% of
# the CPUs busy, unless FORCE=1.
# Environment: OUT (default results/bench; docs/bench with UPDATE_DOCS=1), THREADS (torch threads,
# default 2), FORCE, UPDATE_DOCS.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ "${UPDATE_DOCS:-0}" == 1 ]]; then
    OUT=${OUT:-docs/bench}
else
    OUT=${OUT:-results/bench}
fi
THREADS=${THREADS:-2}
MODE=("$@")
BUSY_SHARE=0.15
BENCHMARK_PATTERN='specscale (bench|simulate|eval|profile-prm|profile-decode)|benchmarks/[A-Za-z0-9_]+\.(py|sh)'

# Other benchmark processes (a `specscale bench`, a benchmarks/ script) with their command lines; this
# script's own process group (itself, its subshells, the command that started it) left out.
other_benchmarks() {
    local own_group
    own_group=$(process_group $$)
    pgrep -f "$BENCHMARK_PATTERN" | while read -r pid; do
        [[ "$(process_group "$pid")" == "$own_group" ]] || ps -o pid=,args= -p "$pid"
    done || true
}

process_group() {
    ps -o pgid= -p "$1" | tr -d ' '
}

# Share of all CPUs busy over one second while this script sleeps: other processes' work (/proc/stat).
cpu_busy_share() {
    local busy0 total0 busy1 total1
    read -r busy0 total0 < <(cpu_times)
    sleep 1
    read -r busy1 total1 < <(cpu_times)
    awk -v busy=$((busy1 - busy0)) -v total=$((total1 - total0)) 'BEGIN { printf "%.2f", busy / (total > 0 ? total : 1) }'
}

cpu_times() {  # busy and total jiffies of all CPUs (idle and iowait are not busy)
    awk 'NR == 1 { total = 0; for (i = 2; i <= NF; i++) total += $i; print total - $5 - $6, total }' /proc/stat
}

if [[ "${FORCE:-0}" != 1 ]]; then
    running=$(other_benchmarks)
    if [[ -n "$running" ]]; then
        echo "another benchmark is running: wait for it, or set FORCE=1 to measure anyway" >&2
        echo "$running" >&2
        exit 1
    fi
    busy=$(cpu_busy_share)
    if awk -v b="$busy" -v limit="$BUSY_SHARE" 'BEGIN { exit !(b > limit) }'; then
        echo "other processes keep $busy of the CPUs busy: wait, or set FORCE=1 to measure anyway" >&2
        exit 1
    fi
fi
echo "writing into $OUT/" >&2

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
