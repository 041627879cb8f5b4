#!/usr/bin/env bash
# scripts/gpu_check.sh — the one GPU check: builds everything, runs every
# dev/cuda workbench (build/cuda/<x> for each dev/cuda/*.cu), every GPU test
# (build/test/test_gpu_*, and the "[gpu]" case of build/test/test_dist), and a short training benchmark (train_gpt_baselines --bench on
# llama-400m, T=2048, B=8, bf16; plus each scheme of $SCHEMES the trainer supports), an inference
# benchmark (train_gpt_baselines --bench-infer: prefill tokens/s, decode ms/token; INFER_BENCH=0
# skips it; test_gpu_infer runs with the other GPU tests), each with its
# own timeout. It never stops at the first failure. Full logs go to $OUT (if set) or
# ./gpu_check_out; a compact table (CHECK/BENCH lines, test totals, benchmarks) is printed LAST.
# Target: under 9 minutes on one H200 (with --prebuilt; the build adds about 1.5 minutes at -j16).
#
#   scripts/gpu_check.sh [--prebuilt] [--quick]
#     --prebuilt   do not run make (use what is in $BUILD)
#     --quick      pass --quick to the workbenches and bench 5 steps instead of 10
# Environment: BUILD (default build), SCHEMES (default "preln hc mhc attnres-full attnres-block"),
#   BENCH_PRESET (llama-400m), BENCH_T (2048), BENCH_B (8), BENCH_STEPS (10),
#   WB_TIMEOUT (120 s per workbench), TEST_TIMEOUT (240 s per test binary), BENCH_TIMEOUT (120 s),
#   BUDGET (540 s for everything after the build: items not started by then are listed as SKIP),
#   RECOMPUTE_BENCH (1: also bench preln --recompute 2),
#   PROFILE_BENCH (1, the default: also bench --profile-stages for each scheme of PROFILE_SCHEMES,
#   default "preln"; "ldm" there profiles train_ldm's rls unwind; the per-stage tables go into the
#   summary; 0: skip),
#   GRAPH_BENCH (1, the default: also bench preln --cuda-graph 1 as "preln-graph"; 0: skip; that the
#   graph gives the eager run's bytes is a test_gpu_train case, run with the GPU tests),
#   NCCL_BENCH (1, the default: also bench preln with --nccl --zero 1, reduction after backward and
#   overlapped with it, on one GPU; 0: skip),
#   LDM_BENCH (1, the default: also bench train_ldm rls unwind at d_k 8 and 4, and window 4; 0: skip;
#   doc/cuda.md "LDM kernels"),
#   TORCH_PEER (1, the default: the PyTorch peer of the preln benchmark, eager and torch.compile,
#   scripts/torch_bench.py; BENCH_PYTHON names its Python, PEER_TIMEOUT 240 s each; 0: skip;
#   PEER_MODES, default "eager compile"; PEER_DEVICE, default cuda: cpu runs the peer on the host,
#   for test_bench_script's dry run of this script on the emulated trainers),
#   LDM_DATA_DIR (data; else ../shared/data).
# Exit status: 0 when every workbench, test and benchmark passed, 1 otherwise; 0 with
# "skipped: no GPU" when no GPU is usable (after building).
set -u
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BUILD=${BUILD:-build}
OUTDIR=${OUT:-$ROOT/gpu_check_out}
SCHEMES=${SCHEMES:-"preln hc mhc attnres-full attnres-block"}
BENCH_PRESET=${BENCH_PRESET:-llama-400m}
BENCH_T=${BENCH_T:-2048}
BENCH_B=${BENCH_B:-8}
BENCH_STEPS=${BENCH_STEPS:-10}
WB_TIMEOUT=${WB_TIMEOUT:-120}
TEST_TIMEOUT=${TEST_TIMEOUT:-240}
BENCH_TIMEOUT=${BENCH_TIMEOUT:-120}
BUDGET=${BUDGET:-540}   # seconds after the build; later items are skipped (listed as SKIP) past it
PREBUILT=0
QUICK=""
for a in "$@"; do
  case "$a" in
    --prebuilt) PREBUILT=1 ;;
    --quick) QUICK="--quick"; BENCH_STEPS=5 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "error: unknown argument '$a' (see --help)" >&2; exit 1 ;;
  esac
done
mkdir -p "$OUTDIR"
T0=$(date +%s)
TABLE="$OUTDIR/table.txt"
: > "$TABLE"
rm -f "$OUTDIR/bench_lines.txt"
FAILS=0
row() { printf '%s\n' "$*" >> "$TABLE"; }
SKIPPED=0
T_RUN=0   # set after the build
over_budget() {  # over_budget <label>: true (and a SKIP row) when the time budget is spent
  if [ $(( $(date +%s) - T_RUN )) -ge "$BUDGET" ]; then
    row "$(printf '%-26s SKIP  (time budget %d s spent)' "$1" "$BUDGET")"; SKIPPED=$((SKIPPED + 1)); return 0
  fi
  return 1
}

# ---- build
if [ "$PREBUILT" = 0 ]; then
  echo "== build (make -j$(nproc) BUILD=$BUILD all tests) -> $OUTDIR/build.log"
  if make -j"$(nproc)" BUILD="$BUILD" all tests > "$OUTDIR/build.log" 2>&1; then
    row "build                      PASS  ($(( $(date +%s) - T0 )) s)"
  else
    row "build                      FAIL  (see build.log; continuing with what was built)"
    FAILS=$((FAILS + 1))
    tail -30 "$OUTDIR/build.log"
  fi
fi

T_RUN=$(date +%s)
TRAINER="$BUILD/cuda/train_gpt_baselines"
GPU_DESC=""
if [ -x "$TRAINER" ]; then
  GPU_DESC=$("$TRAINER" --gpu-info 2>&1); GPU_RC=$?
else
  if [ "$PREBUILT" = 1 ]; then
    echo "gpu_check: error: $TRAINER is missing (build first, or point BUILD at the build directory)" >&2
    exit 1
  fi
  GPU_RC=127
fi
if [ "$GPU_RC" != 0 ]; then
  if command -v nvidia-smi > /dev/null && nvidia-smi -L > /dev/null 2>&1; then
    GPU_DESC="(trainer missing or failed: $GPU_DESC) $(nvidia-smi -L | head -1)"
  else
    cat "$TABLE"
    echo "gpu_check: skipped ($GPU_DESC)"
    exit 0
  fi
fi
echo "== device: $GPU_DESC"

# ---- workbenches
for src in dev/cuda/*.cu; do
  name=$(basename "$src" .cu)
  bin="$BUILD/cuda/$name"
  log="$OUTDIR/wb_$name.log"
  if [ ! -x "$bin" ]; then
    row "$(printf 'workbench %-16s FAIL  (not built)' "$name")"; FAILS=$((FAILS + 1)); continue
  fi
  over_budget "workbench $name" && continue
  echo "== workbench $name"
  t0=$(date +%s)
  timeout -k 5 "$WB_TIMEOUT" "$bin" $QUICK > "$log" 2>&1; rc=$?
  dt=$(( $(date +%s) - t0 ))
  nchk=$(grep -c '^CHECK ' "$log"); nfail=$(grep '^CHECK ' "$log" | grep -vc ' PASS$')
  st=PASS
  if [ "$rc" != 0 ] || [ "$nfail" != 0 ] || [ "$nchk" = 0 ]; then st=FAIL; FAILS=$((FAILS + 1)); fi
  [ "$rc" = 124 ] && st="FAIL (timeout ${WB_TIMEOUT}s)"
  row "$(printf 'workbench %-16s %s  checks %d, failed %d, exit %d, %d s' "$name" "$st" "$nchk" "$nfail" "$rc" "$dt")"
  grep '^CHECK ' "$log" | grep -v ' PASS$' | sed 's/^/    /' >> "$TABLE"
  grep '^BENCH ' "$log" | sed 's/^/    /' >> "$TABLE"
done

# ---- GPU tests
for bin in "$BUILD"/test/test_gpu_*; do
  [ -x "$bin" ] || continue
  case "$bin" in *.o|*.d) continue ;; esac
  name=$(basename "$bin")
  log="$OUTDIR/$name.log"
  over_budget "test $name" && continue
  echo "== test $name"
  t0=$(date +%s)
  timeout -k 5 "$TEST_TIMEOUT" "$bin" > "$log" 2>&1; rc=$?
  dt=$(( $(date +%s) - t0 ))
  tot=$(grep '^LDM_TEST_TOTALS' "$log" | tail -1)
  if [ -n "$tot" ]; then
    read -r _ p f <<< "$tot"
  else
    p=0; f="?"
  fi
  st=PASS
  if [ "$rc" != 0 ] || [ "$f" != 0 ]; then st=FAIL; FAILS=$((FAILS + 1)); fi
  [ "$rc" = 124 ] && st="FAIL (timeout ${TEST_TIMEOUT}s)"
  skipped=$(grep -c 'skipped: no GPU' "$log")
  row "$(printf 'test %-21s %s  %s passed, %s failed, exit %d, %d s%s' "$name" "$st" "$p" "$f" "$rc" "$dt" \
        "$([ "$skipped" != 0 ] && echo ' (skipped: no GPU)')")"
  # the per-tensor comparison lines of failing checks, and the WARN summaries
  grep -E 'FAIL$|worst gradient' "$log" | head -20 | sed 's/^/    /' >> "$TABLE"
done

# ---- the data-parallel GPU case of test_dist (one GPU: --nccl ZeRO-0/1, overlap on/off == plain)
DIST_BIN="$BUILD/test/test_dist"
if [ -x "$DIST_BIN" ] && ! over_budget "test test_dist[gpu]"; then
  echo "== test test_dist [gpu]"
  log="$OUTDIR/test_dist_gpu.log"
  t0=$(date +%s)
  timeout -k 5 "$TEST_TIMEOUT" "$DIST_BIN" "[gpu]" > "$log" 2>&1; rc=$?
  dt=$(( $(date +%s) - t0 ))
  tot=$(grep '^LDM_TEST_TOTALS' "$log" | tail -1)
  if [ -n "$tot" ]; then read -r _ p f <<< "$tot"; else p=0; f="?"; fi
  st=PASS
  if [ "$rc" != 0 ] || [ "$f" != 0 ]; then st=FAIL; FAILS=$((FAILS + 1)); fi
  [ "$rc" = 124 ] && st="FAIL (timeout ${TEST_TIMEOUT}s)"
  row "$(printf 'test %-21s %s  %s passed, %s failed, exit %d, %d s' "test_dist[gpu]" "$st" "$p" "$f" "$rc" "$dt")"
  grep -E 'FAILED|with expansion' "$log" | head -20 | sed 's/^/    /' >> "$TABLE"
fi

# ---- benchmark data: FineWeb-Edu sample shards (or a synthetic shard without the data)
DATA_DIR=${LDM_DATA_DIR:-$ROOT/../shared/data}
BDATA="$OUTDIR/bench_data"
mkdir -p "$BDATA"
if ! ls "$BDATA"/*train*.bin > /dev/null 2>&1; then
  if [ -f "$DATA_DIR/fineweb_edu_sample/fineweb_edu_sample.jsonl" ] && [ -x "$BUILD/ldm_data" ]; then
    "$BUILD/ldm_data" shards --tokenizer "$DATA_DIR/gpt2_tokenizer" \
      --input "$DATA_DIR/fineweb_edu_sample/fineweb_edu_sample.jsonl" \
      --out-dir "$BDATA" --name fineweb --val-docs 5 > "$OUTDIR/bench_data.log" 2>&1
  fi
fi
if ! ls "$BDATA"/*train*.bin > /dev/null 2>&1; then
  # synthetic llm.c-format uint16 shard: 256 int32 header (magic 20240520, version 1, count), tokens
  python3 - "$BDATA/synthetic_train_000001.bin" <<'EOF'
import random, struct, sys
n = 300000
random.seed(1)
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
    f.write(struct.pack("<%dH" % n, *[random.randrange(50257) for _ in range(n)]))
EOF
fi
TRAIN_GLOB="$BDATA/*train*.bin"
TOK_FLAG=""
[ -f "$DATA_DIR/gpt2_tokenizer/encoder.json" ] && TOK_FLAG="--tokenizer $DATA_DIR/gpt2_tokenizer"

# ---- benchmarks
bench() {  # bench <label> <extra flags...>
  local label=$1; shift
  over_budget "bench $label" && return
  local log="$OUTDIR/bench_$label.log"
  echo "== bench $label"
  local t0=$(date +%s)
  timeout -k 5 "$BENCH_TIMEOUT" "$TRAINER" --preset "$BENCH_PRESET" -T "$BENCH_T" -B "$BENCH_B" --dtype bf16 \
    --bench "$BENCH_STEPS" --train-data "$TRAIN_GLOB" $TOK_FLAG --sample-every -1 --quiet "$@" > "$log" 2>&1
  local rc=$? dt=$(( $(date +%s) - t0 ))
  local line=$(grep '^BENCH ' "$log" | tail -1)
  if [ "$rc" = 0 ] && [ -n "$line" ]; then
    row "$(printf 'bench %-20s PASS  %s' "$label" "$(python3 -c '
import json, sys
j = json.loads(sys.argv[1][6:])
mfu = "MFU %.1f%% (peak %.0f TFLOP/s)" % (100 * j["mfu"], j["peak_bf16_tflops"]) if j.get("mfu") else "MFU n/a (peak unknown)"
print("%.0f tok/s, %.1f ms/step, %s, peak mem %.1f GiB, scheme %d B/token" % (
    j["tokens_per_s"], j["step_ms"], mfu, j["peak_mem_gib"], j["scheme_bytes_per_token"]))' "$line" 2>/dev/null || echo "$line")")"
    printf '%s\t%s\n' "$label" "${line#BENCH }" >> "$OUTDIR/bench_lines.txt"
    # --profile-stages: its per-stage table goes into the summary too
    sed -n '/^stage breakdown/,/^  sum of the stages/p' "$log" | sed 's/^/    /' >> "$TABLE"
  elif grep -q "runs on the GPU in train_ldm\|trains --scheme ldm only" "$log"; then
    row "$(printf 'bench %-20s n/a   (scheme of the other GPU trainer)' "$label")"
  else
    FAILS=$((FAILS + 1))
    row "$(printf 'bench %-20s FAIL  exit %d, %d s: %s' "$label" "$rc" "$dt" "$(grep -m1 'error' "$log")")"
  fi
}
if [ -x "$TRAINER" ]; then
  for s in $SCHEMES; do bench "$s" --scheme "$s"; done
  [ "${RECOMPUTE_BENCH:-0}" = 1 ] && bench "preln-recompute2" --scheme preln --recompute 2
  [ "${GRAPH_BENCH:-1}" = 1 ] && bench "preln-graph" --scheme preln --cuda-graph 1
  if [ "${PROFILE_BENCH:-1}" = 1 ]; then  # where each scheme's step time goes (doc/cuda.md "Per-stage profile")
    for s in ${PROFILE_SCHEMES:-preln}; do
      if [ "$s" = ldm ]; then
        TRAINER="$BUILD/cuda/train_ldm" bench "ldm-profile" --ldm-rule rls --ldm-mode unwind --profile-stages
      else
        bench "$s-profile" --scheme "$s" --profile-stages
      fi
    done
  fi
  if [ "${NCCL_BENCH:-1}" = 1 ]; then  # cost of the NCCL path on one GPU (target <= 2% over preln)
    bench "preln-nccl-z1-flat" --scheme preln --nccl --zero 1 --nccl-overlap 0
    bench "preln-nccl-z1-overlap" --scheme preln --nccl --zero 1 --nccl-overlap 1
  fi
  # inference (cuda/infer.cuh): prefill of T/2 tokens, then min(128, T/2) decode steps, B sequences
  if [ "${INFER_BENCH:-1}" = 1 ] && ! over_budget "bench infer-preln"; then
    ilog="$OUTDIR/bench_infer_preln.log"
    echo "== bench infer-preln"
    t0=$(date +%s)
    timeout -k 5 "$BENCH_TIMEOUT" "$TRAINER" --preset "$BENCH_PRESET" -T "$BENCH_T" -B "$BENCH_B" --dtype bf16 \
      --scheme preln $TOK_FLAG --bench-infer "$((BENCH_T / 2)):$(( BENCH_T / 2 < 128 ? BENCH_T / 2 : 128 ))" > "$ilog" 2>&1
    rc=$? dt=$(( $(date +%s) - t0 ))
    iline=$(grep '^BENCH_INFER ' "$ilog" | tail -1)
    if [ "$rc" = 0 ] && [ -n "$iline" ]; then
      row "$(printf 'bench %-20s PASS  %s' "infer-preln" "$(python3 -c '
import json, sys
j = json.loads(sys.argv[1][12:])
print("prefill %.0f tok/s (B=%d, P=%d), decode %.3f ms/token median (%.0f tok/s), KV cache %.0f MiB, peak mem %.1f GiB" % (
    j["prefill_tokens_per_s"], j["B"], j["prompt_tokens"], j["decode_ms_median"], j["decode_tokens_per_s"],
    j["kv_cache_bytes"] / 2**20, j["peak_mem_gib"]))' "$iline" 2>/dev/null || echo "$iline")")"
    else
      FAILS=$((FAILS + 1))
      row "$(printf 'bench %-20s FAIL  exit %d, %d s: %s' "infer-preln" "$rc" "$dt" "$(grep -m1 'error' "$ilog")")"
    fi
    fi
  if [ "${LDM_BENCH:-1}" != 0 ]; then  # LDM window paths (train_ldm); the workbench checks them first
    TRAINER="$BUILD/cuda/train_ldm" bench "ldm-rls-unwind" --ldm-rule rls --ldm-mode unwind
    TRAINER="$BUILD/cuda/train_ldm" bench "ldm-rls-unwind-dk4" --ldm-rule rls --ldm-mode unwind --ldm-dk 4
    TRAINER="$BUILD/cuda/train_ldm" bench "ldm-rls-window4" --ldm-rule rls --ldm-mode window --ldm-window 4
  fi
else
  row "bench                      FAIL  ($TRAINER not built)"; FAILS=$((FAILS + 1))
fi

# ---- the PyTorch peer of the preln benchmark (scripts/torch_bench.py: the same model, bf16 autocast,
# SDPA; eager and torch.compile), in the same run; rows "torch-<mode>" of the table (MFU against the
# C++ run's FLOPs per token and measured peak)
PEER_PY=""
PEER_DEVICE=${PEER_DEVICE:-cuda}
PEER_PROBE='import torch; assert torch.cuda.is_available()'
[ "$PEER_DEVICE" = cpu ] && PEER_PROBE='import torch'
for p in ${BENCH_PYTHON:-} python3 /usr/bin/python3; do
  if command -v "$p" > /dev/null && "$p" -c "$PEER_PROBE" 2> /dev/null; then PEER_PY=$p; break; fi
done
if [ "${TORCH_PEER:-1}" = 1 ] && [ -z "$PEER_PY" ]; then
  row "peer torch                 n/a   (no Python with $([ "$PEER_DEVICE" = cpu ] || echo 'CUDA ')PyTorch)"
elif [ "${TORCH_PEER:-1}" = 1 ]; then
  for mode in ${PEER_MODES:-eager compile}; do
    over_budget "peer torch-$mode" && continue
    plog="$OUTDIR/peer_torch_$mode.log"
    echo "== peer torch-$mode"
    t0=$(date +%s)
    timeout -k 5 "${PEER_TIMEOUT:-240}" "$PEER_PY" scripts/torch_bench.py bench --device "$PEER_DEVICE" --mode "$mode" --dtype bf16 \
      --preset "$BENCH_PRESET" --scheme preln -B "$BENCH_B" -T "$BENCH_T" --steps "$BENCH_STEPS" --warmup 2 \
      --spec-bin "$BUILD/generate_cpu" > "$plog" 2>&1
    rc=$? dt=$(( $(date +%s) - t0 ))
    pline=$(grep '^BENCH ' "$plog" | tail -1)
    if [ "$rc" = 0 ] && [ -n "$pline" ]; then
      res=$(python3 - "$pline" "$OUTDIR/bench_lines.txt" "$mode" <<'PYEOF'
import json, sys
j = json.loads(sys.argv[1][6:])
base = None
try:
    for l in open(sys.argv[2]):
        k, v = l.rstrip("\n").split("\t", 1)
        if k == "preln":
            base = json.loads(v)
except OSError:
    pass
j["mfu"] = (base["model_flops_per_token"] * j["tokens_per_s"] / 1e12 / base["peak_bf16_tflops"]) if base and base.get("peak_bf16_tflops") else None
with open(sys.argv[2], "a") as f:
    f.write("torch-%s\t%s\n" % (sys.argv[3], json.dumps(j)))
ratio = ("C++ preln / this %.2fx" % (base["tokens_per_s"] / j["tokens_per_s"])) if base else "no C++ preln row"
print("%.0f tok/s, %.1f ms/step, peak mem %.1f GiB, attention %s (GQA %s), %s" % (
    j["tokens_per_s"], j["step_ms"], j["peak_mem_gib"], j.get("attention_backend"), j.get("gqa"), ratio))
PYEOF
)
      row "$(printf 'peer torch-%-15s PASS  %s' "$mode" "$res")"
    else
      FAILS=$((FAILS + 1))
      row "$(printf 'peer torch-%-15s FAIL  exit %d, %d s: %s' "$mode" "$rc" "$dt" "$(grep -m1 -i 'error' "$plog")")"
    fi
  done
fi

# ---- the table, LAST
echo
echo "================ gpu_check: $GPU_DESC ================"
cat "$TABLE"
if [ -f "$OUTDIR/bench_lines.txt" ]; then
  python3 - "$OUTDIR/bench_lines.txt" <<'EOF' || cat "$OUTDIR/bench_lines.txt"
import json, sys
rows = [l.rstrip("\n").split("\t", 1) for l in open(sys.argv[1]) if "\t" in l]
rows = [(k, json.loads(v)) for k, v in rows]
base = dict(rows).get("preln")
print("%-22s %10s %9s %6s %9s %12s %12s" % ("benchmark", "tok/s", "ms/step", "MFU", "mem GiB", "tok/s/preln", "mem/preln"))
for k, j in rows:
    rel_t = "%.3f" % (j["tokens_per_s"] / base["tokens_per_s"]) if base else "-"
    rel_m = "%.3f" % (j["peak_mem_gib"] / base["peak_mem_gib"]) if base else "-"
    mfu = "%5.1f%%" % (100 * j["mfu"]) if j.get("mfu") else "%6s" % "-"
    print("%-22s %10.0f %9.1f %s %9.1f %12s %12s" % (k, j["tokens_per_s"], j["step_ms"], mfu, j["peak_mem_gib"],
                                                    rel_t, rel_m))
EOF
fi
echo "total $(( $(date +%s) - T0 )) s; logs in $OUTDIR; $([ "$FAILS" = 0 ] && echo 'ALL PASS' || echo "$FAILS FAILED")$([ "$SKIPPED" != 0 ] && echo ", $SKIPPED SKIPPED (time budget)")"
[ "$FAILS" = 0 ]
