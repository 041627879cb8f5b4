#!/usr/bin/env bash
# CPU training benchmark (issue #3 "Performance"): `small` at T=256 on all cores.
# Prints training tokens/s, the GFLOP/s achieved by the forward+backward matmuls (FLOPs and
# time counted by cpu's gemm() around every BLAS call), the BLAS peak measured in the same
# run (a 2048^3 SGEMM of the same OpenBLAS, same threads), and the fraction of the step time
# spent inside BLAS (target >= 70%). Real data: shards of the FineWeb-Edu sample.
# Usage: scripts/bench_cpu.sh [steps (default 10)]   env: BUILD (default build), BENCH_B (4),
#        BENCH_THREADS (0 = all cores), BENCH_OUT (default out/bench_cpu)
set -euo pipefail
case "${1:-}" in -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;; esac
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
STEPS=${1:-10}
B=${BENCH_B:-4}
THREADS=${BENCH_THREADS:-0}
OUT=${BENCH_OUT:-out/bench_cpu}
for bin in "$BUILD/ldm_data" "$BUILD/train_cpu"; do
  [ -x "$bin" ] || { echo "bench_cpu: $bin missing; run 'make' first" >&2; exit 1; }
done
DATA=""
for d in "${LDM_DATA_DIR:-}" ../shared/data; do
  if [ -n "$d" ] && [ -f "$d/fineweb_edu_sample/fineweb_edu_sample.jsonl" ]; then DATA=$d; break; fi
done
[ -n "$DATA" ] || { echo "bench_cpu: no FineWeb-Edu sample (\$LDM_DATA_DIR or ../shared/data); run scripts/demo.sh" >&2; exit 1; }
mkdir -p "$OUT"
rm -f "$OUT/bench.jsonl"  # this script's own log of the last run (a trainer never replaces a log unasked)
if [ ! -f "$OUT/data/fineweb_train_000001.bin" ]; then
  "$BUILD/ldm_data" shards --tokenizer "$DATA/gpt2_tokenizer" \
    --input "$DATA/fineweb_edu_sample/fineweb_edu_sample.jsonl" --out-dir "$OUT/data" --name fineweb --val-docs 15 --quiet
fi
echo "bench_cpu: small, B=$B T=256, $STEPS timed steps after 2 warm-up steps, threads=${THREADS} (0 = all: $(nproc))"
# OpenMP threads must not spin while OpenBLAS's own threads run the GEMMs (2 cores).
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
line=$("$BUILD/train_cpu" --preset small -B "$B" -T 256 --bench "$STEPS" --threads "$THREADS" --quiet \
  --train-data "$OUT/data/fineweb_train_*.bin" --tokenizer "$DATA/gpt2_tokenizer" --sample-every -1 \
  --log "$OUT/bench.jsonl" | tee "$OUT/console.txt" | grep '^BENCH ' | sed 's/^BENCH //')
/usr/bin/python3 - "$line" <<'PY'
import json, sys
r = json.loads(sys.argv[1])
print("| metric | value |")
print("|---|---|")
print("| training tokens/s (small, T=%d, B=%d, %s, %d threads) | %.0f |" % (r["T"], r["B"], r["dtype"], r["threads"], r["tokens_per_s"]))
print("| step time (median of %d steps; mean %.1f ms) | %.1f ms |" % (r["steps_timed"], r["step_ms_mean"], r["step_ms"]))
print("| time in BLAS per step | %.1f ms (%.1f%% of the step; target >= 70%%) |" % (r["gemm_ms"], 100 * r["gemm_fraction"]))
print("| fwd+bwd matmul rate | %.1f GFLOP/s |" % r["gemm_gflops"])
print("| BLAS peak, 2048^3 GEMM same run | %.1f GFLOP/s |" % r["blas_peak_gflops"])
print("| matmul rate / peak | %.1f%% |" % (100 * r["gemm_vs_peak"]))
PY
