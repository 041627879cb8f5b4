#!/usr/bin/env bash
# scripts/gpu_check.sh — the one GPU check, sized for one call on a lent GPU machine: builds what
# it needs (make gpu-check-build), then runs, most wanted first, until its time budget is spent:
#   1. test_gpu_train (PreLN and its CUDA graph against the CPU); benches preln, preln-graph and the
#      --profile-stages benches of $PROFILE_SCHEMES
#   2. the attention workbench (its BENCH lines: TFLOP/s of every variant)
#   3. benches of the other schemes of $SCHEMES, LDM rls unwind at d_k 8 and 4, PreLN at $QWEN_SHAPE
#   4. the PyTorch peer of the preln bench (eager, then torch.compile)
#   5. the scheme workbenches (ldm, hc, attnres), then test_gpu_schemes and test_gpu_ldm
#   6. every other dev/cuda workbench, test_gpu_infer, test_dist's "[gpu]" case
#   7. benches LDM window 4, preln over NCCL (ZeRO-1, flat and overlapped), preln --recompute 2
#      (RECOMPUTE_BENCH=1), inference (prefill tokens/s, decode ms/token)
# Items not started within the budget are listed as SKIP; each item's timeout is cut to what is
# left of it, so the script ends near BUDGET seconds after it started. It never stops at the
# first failure. Full logs go to $OUT (if set) or ./gpu_check_out. At the end it prints a compact
# table (CHECK/BENCH lines, test totals, benchmarks), then every target of
# ../shared/spec/performance.md and issues #17/#18 marked met, missed or not measured
# (scripts/gpu_targets.py; also targets.md in the log folder, in PACK, and beside PACK), then the
# status rows again and the totals.
#
# On a lent device machine (one call of at most 600 s; the call carries the checkout only): here,
#   mkdir -p shared && cp -r --no-preserve=mode ../shared/data shared/
# then the call, with timeout_s 590:
#   PACK=$OUT/gpu_check.tgz OUT=/tmp/gc bash scripts/gpu_check.sh
# and, if device time is left, at once on the still-warm machine, with BUDGET fitting what is left:
#   PACK=$OUT/gpu_check2.tgz OUT=/tmp/gc BUDGET=180 bash scripts/gpu_check.sh --rest
#
#   scripts/gpu_check.sh [--prebuilt] [--rest] [--quick]
#     --prebuilt   do not run make (use what is in $BUILD)
#     --rest       run only what the last run in $OUT skipped or did not reach, keeping its rows
#                  (implies --prebuilt; for a second call on the still-warm machine, with its own
#                  BUDGET)
#     --quick      pass --quick to the workbenches (fewer shapes; attention then times nothing)
#                  and bench 5 steps instead of 20
# Environment: BUDGET (510 s for the whole script, build included: one 600 s device call with
#   room to spare), BUILD (default build), SCHEMES (default "preln hc mhc attnres-full
#   attnres-block"), BENCH_PRESET (llama-400m), BENCH_T (2048), BENCH_B (8), BENCH_STEPS (20: the
#   spec's median of >= 20 steps),
#   QWEN_SHAPE (qwen-1.5b:2048:4, PRESET:T:B of the second PreLN MFU target; "" skips it),
#   WB_TIMEOUT (120 s per workbench), TEST_TIMEOUT (240 s per test binary), BENCH_TIMEOUT (120 s),
#   MIN_ITEM (20: an item is started only with this many seconds of the budget left),
#   RECOMPUTE_BENCH (0, the default; 1: also bench preln --recompute 2),
#   PROFILE_BENCH (1, the default: also bench --profile-stages for each scheme of PROFILE_SCHEMES,
#   default "preln"; "ldm" there profiles train_ldm's rls unwind; the per-stage tables go into the
#   summary; 0: skip),
#   GRAPH_BENCH (1, the default: also bench preln --cuda-graph 1 as "preln-graph"; 0: skip; that the
#   graph gives the eager run's bytes is a test_gpu_train case),
#   NCCL_BENCH (1, the default: also bench preln with --nccl --zero 1, reduction after backward and
#   overlapped with it, on one GPU; 0: skip),
#   LDM_BENCH (1, the default: also bench train_ldm rls unwind at d_k 8 and 4, and window 4; 0: skip;
#   doc/cuda.md "LDM kernels"),
#   INFER_BENCH (1, the default; 0: skip the inference bench),
#   TORCH_PEER (1, the default: the PyTorch peer of the preln benchmark, eager and torch.compile,
#   scripts/torch_bench.py; BENCH_PYTHON names its Python, PEER_TIMEOUT 240 s each; 0: skip;
#   PEER_MODES, default "eager compile"; PEER_DEVICE, default cuda: cpu runs the peer on the host,
#   for test_bench_script's dry run of this script on the emulated trainers),
#   LDM_DATA_DIR (data; else ../shared/data, else ./shared/data: on a device call, which carries
#   the checkout only, copy ../shared/data there first; git ignores it),
#   PACK (a file: every log of $OUT packed into it with tar -z at the end, and targets.md copied
#   beside it; a device call brings back at most 8 files, so run it there as
#   PACK=$OUT/gpu_check.tgz OUT=/tmp/gc bash scripts/gpu_check.sh, PACK first: it takes the device
#   call's $OUT, OUT then names the log folder).
# Exit status: 0 when every workbench, test and benchmark that ran passed (a missed performance
# target is reported, not a failure), 1 otherwise; 0 with
# "skipped: no GPU" when no GPU is usable (after building).
set -u
# paths given relative to the caller's directory, before the cd to the repository root
[ -n "${LDM_DATA_DIR:-}" ] && [ -d "$LDM_DATA_DIR" ] && LDM_DATA_DIR=$(cd "$LDM_DATA_DIR" && pwd)
case "${OUT:-/}" in /*) ;; *) OUT="$PWD/$OUT" ;; esac
case "${PACK:-/}" in /*) ;; *) PACK="$PWD/$PACK" ;; esac
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BUILD=${BUILD:-build}
OUTDIR=${OUT:-$ROOT/gpu_check_out}
SCHEMES=${SCHEMES:-"preln hc mhc attnres-full attnres-block"}
BENCH_PRESET=${BENCH_PRESET:-llama-400m}
BENCH_T=${BENCH_T:-2048}
BENCH_B=${BENCH_B:-8}
BENCH_STEPS=${BENCH_STEPS:-20}
QWEN_SHAPE=${QWEN_SHAPE-qwen-1.5b:2048:4}
WB_TIMEOUT=${WB_TIMEOUT:-120}
TEST_TIMEOUT=${TEST_TIMEOUT:-240}
BENCH_TIMEOUT=${BENCH_TIMEOUT:-120}
BUDGET=${BUDGET:-510}     # seconds for the whole script, build included
MIN_ITEM=${MIN_ITEM:-20}  # an item starts only with at least this much of the budget left
PREBUILT=0
REST=0
QUICK=""
for a in "$@"; do
  case "$a" in
    --prebuilt) PREBUILT=1 ;;
    --rest) REST=1; PREBUILT=1 ;;
    --quick) QUICK="--quick"; BENCH_STEPS=5 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "error: unknown argument '$a' (see --help)" >&2; exit 1 ;;
  esac
done
mkdir -p "$OUTDIR"
T0=$(date +%s)
TABLE="$OUTDIR/table.txt"
FAILS=0
SKIPPED=0
DONE="|"  # --rest: the labels ("workbench attention", "bench preln", ...) the last run ran
if [ "$REST" = 1 ] && [ -f "$TABLE" ]; then
  DONE="|$(grep -v '^    ' "$TABLE" | grep -v ' SKIP  (time budget' | awk '{ printf "%s %s|", $1, $2 }')"
  FAILS=$(grep -v '^    ' "$TABLE" | grep -c ' FAIL')
  grep -v ' SKIP  (time budget' "$TABLE" > "$TABLE.tmp"; mv -f "$TABLE.tmp" "$TABLE"
else
  : > "$TABLE"
  # the last run's logs, so that nothing stale feeds the tables or the targets (bench_data stays)
  rm -f "$OUTDIR/bench_lines.txt" "$OUTDIR/targets.md" "$OUTDIR"/wb_*.log "$OUTDIR"/bench_*.log "$OUTDIR"/peer_*.log
fi
done_before() { case "$DONE" in *"|$1|"*) return 0 ;; esac; return 1; }
# cut_short <label> <rc>: true (and a SKIP row, which --rest runs again) when the item was stopped
# by a timeout that the budget had cut below its own
cut_short() {
  case "$2" in 124|137) ;; *) return 1 ;; esac
  [ "$ITEM_TIMEOUT" -lt "$ITEM_FULL" ] || return 1
  row "$(printf '%-26s SKIP  (time budget %d s spent: stopped after %d s)' "$1" "$BUDGET" "$ITEM_TIMEOUT")"
  SKIPPED=$((SKIPPED + 1))
}
is_timeout() { case "$1" in 124|137) return 0 ;; esac; return 1; }
# timed <label> <log> <command...>: the item's command under its timeout, output to log; sets RC
# (exit status) and DT (seconds); false when the budget's cut stopped it (cut_short wrote its row)
RC=0
DT=0
timed() {
  local label=$1 log=$2 t0=$(date +%s)
  shift 2
  timeout -k 5 "$ITEM_TIMEOUT" "$@" > "$log" 2>&1; RC=$?
  DT=$(( $(date +%s) - t0 ))
  ! cut_short "$label" "$RC"
}
row() { printf '%s\n' "$*" >> "$TABLE"; }
# start_item <label> <timeout>: false (and a SKIP row) when less than MIN_ITEM seconds (at least
# 1) of the budget are left; else ITEM_TIMEOUT = min(timeout, seconds left)
ITEM_TIMEOUT=0
ITEM_FULL=0
start_item() {
  local left=$(( BUDGET - ($(date +%s) - T0) ))
  if [ "$left" -lt "$MIN_ITEM" ] || [ "$left" -lt 1 ]; then
    row "$(printf '%-26s SKIP  (time budget %d s spent)' "$1" "$BUDGET")"; SKIPPED=$((SKIPPED + 1)); return 1
  fi
  ITEM_FULL=$2
  ITEM_TIMEOUT=$(( $2 < left ? $2 : left ))
  echo "== $1 (timeout ${ITEM_TIMEOUT} s; $(( $(date +%s) - T0 )) s elapsed)"
  return 0
}

# ---- build: the CUDA programs, the CPU tools and the GPU tests (not the CPU/emulation tests)
if [ "$PREBUILT" = 0 ]; then  # the system headers the library and the tests need (no installs on a device machine)
  missing=""
  for h in pcre2.h utf8proc.h cblas.h bzlib.h catch2/catch.hpp; do
    printf '#define PCRE2_CODE_UNIT_WIDTH 8\n#include <%s>\n' "$h" | ${CXX:-g++} -E -x c++ - > /dev/null 2>&1 || missing="$missing $h"
  done
  [ -n "$missing" ] && row "deps                       MISSING:$missing (scripts/install_deps.sh installs them; the build will fail)"
fi
if [ "$PREBUILT" = 0 ] && [ "$BUDGET" -le 0 ]; then
  row "build                      SKIP  (time budget $BUDGET s)"; SKIPPED=$((SKIPPED + 1))
elif [ "$PREBUILT" = 0 ]; then
  echo "== build (make -k -j$(nproc) BUILD=$BUILD NVCC_THREADS=2 gpu-check-build) -> $OUTDIR/build.log"
  if timeout -k 5 "$BUDGET" make -k -j"$(nproc)" BUILD="$BUILD" NVCC_THREADS=2 gpu-check-build > "$OUTDIR/build.log" 2>&1; then
    row "build                      PASS  ($(( $(date +%s) - T0 )) s)"
  else
    row "build                      FAIL  ($(( $(date +%s) - T0 )) s; see build.log; continuing with what was built)"
    FAILS=$((FAILS + 1))
    tail -30 "$OUTDIR/build.log"
  fi
fi

TRAINER="$BUILD/cuda/train_gpt_baselines"
GPU_DESC=""
if [ -x "$TRAINER" ]; then
  GPU_DESC=$(timeout -k 5 60 "$TRAINER" --gpu-info 2>&1); GPU_RC=$?
else
  if [ "$PREBUILT" = 1 ]; then
    echo "gpu_check: error: $TRAINER is missing (build first, or point BUILD at the build directory)" >&2
    exit 1
  fi
  GPU_RC=127
fi
if [ "$GPU_RC" != 0 ]; then
  if command -v nvidia-smi > /dev/null && timeout -k 5 60 nvidia-smi -L > /dev/null 2>&1; then
    GPU_DESC="(trainer missing or failed: $GPU_DESC) $(timeout -k 5 60 nvidia-smi -L | head -1)"
  else
    cat "$TABLE"
    echo "gpu_check: skipped ($GPU_DESC)"
    exit 0
  fi
fi
echo "== device: $GPU_DESC"
# the card as found, and after the run (clocks, temperature, power: timings depend on them)
gpu_state() {
  command -v nvidia-smi > /dev/null || return 0
  local q
  q=$(timeout -k 5 20 nvidia-smi --query-gpu=name,driver_version,temperature.gpu,clocks.sm,clocks.max.sm,clocks.mem,power.draw,power.limit \
      --format=csv,noheader 2> /dev/null | head -1)
  [ -n "$q" ] && row "$(printf 'gpu %-22s name, driver, temperature C, SM clock, max SM clock, memory clock, power, power limit: %s' "($1)" "$q")"
  return 0
}
gpu_state start

# ---- the items
workbench() {  # workbench <name>: build/cuda/<name> [--quick]; its CHECK failures and BENCH lines
  local name=$1 bin="$BUILD/cuda/$1" log="$OUTDIR/wb_$1.log"
  done_before "workbench $name" && return
  if [ ! -x "$bin" ]; then
    row "$(printf 'workbench %-16s FAIL  (not built)' "$name")"; FAILS=$((FAILS + 1)); return
  fi
  start_item "workbench $name" "$WB_TIMEOUT" || return
  timed "workbench $name" "$log" "$bin" $QUICK || return
  local rc=$RC dt=$DT
  local nchk=$(grep -c '^CHECK ' "$log") nfail=$(grep '^CHECK ' "$log" | grep -vc ' PASS$')
  local st=PASS
  if [ "$rc" != 0 ] || [ "$nfail" != 0 ] || [ "$nchk" = 0 ]; then st=FAIL; FAILS=$((FAILS + 1)); fi
  is_timeout "$rc" && st="FAIL (timeout ${ITEM_TIMEOUT}s)"
  row "$(printf 'workbench %-16s %s  checks %d, failed %d, exit %d, %d s' "$name" "$st" "$nchk" "$nfail" "$rc" "$dt")"
  grep '^CHECK ' "$log" | grep -v ' PASS$' | sed 's/^/    /' >> "$TABLE"
  grep '^BENCH ' "$log" | sed 's/^/    /' >> "$TABLE"
}
WB_DONE=" "
workbenches() {  # workbenches <name>...: each not yet run (dev/cuda/<name>.cu must exist)
  local n
  for n in "$@"; do
    case "$WB_DONE" in *" $n "*) continue ;; esac
    WB_DONE="$WB_DONE$n "
    workbench "$n"
  done
}

gpu_test() {  # gpu_test <label> <binary> [Catch2 arguments]: its totals; failing cases' lines
  local label=$1 bin=$2; shift 2
  done_before "test $label" && return
  [ -x "$bin" ] || { row "$(printf 'test %-21s FAIL  (not built)' "$label")"; FAILS=$((FAILS + 1)); return; }
  start_item "test $label" "$TEST_TIMEOUT" || return
  local log="$OUTDIR/$(echo "$label" | tr -c 'A-Za-z0-9_\n' '_').log"
  timed "test $label" "$log" "$bin" "$@" || return
  local rc=$RC dt=$DT
  local tot=$(grep '^LDM_TEST_TOTALS' "$log" | tail -1) p=0 f="?"
  [ -n "$tot" ] && read -r _ p f <<< "$tot"
  local st=PASS
  if [ "$rc" != 0 ] || [ "$f" != 0 ]; then st=FAIL; FAILS=$((FAILS + 1)); fi
  is_timeout "$rc" && st="FAIL (timeout ${ITEM_TIMEOUT}s)"
  local skipped=$(grep -c 'skipped: no GPU' "$log")
  row "$(printf 'test %-21s %s  %s passed, %s failed, exit %d, %d s%s' "$label" "$st" "$p" "$f" "$rc" "$dt" \
        "$([ "$skipped" != 0 ] && echo ' (skipped: no GPU)')")"
  # the per-tensor comparison lines of failing checks, Catch2's failures, the WARN summaries
  grep -E 'FAIL$|FAILED|with expansion|worst gradient' "$log" | head -20 | sed 's/^/    /' >> "$TABLE"
}

# the data (tokenizers, FineWeb-Edu sample): $LDM_DATA_DIR, ../shared/data, or ./shared/data (a
# copy made for a device call, which carries the checkout only); the tests find it through
# LDM_DATA_DIR. Without it the GPU tests skip their data cases and the benches use a synthetic shard.
DATA_DIR=""
for d in "${LDM_DATA_DIR:-}" "$ROOT/../shared/data" "$ROOT/shared/data"; do
  [ -n "$d" ] && [ -d "$d" ] && { DATA_DIR=$(cd "$d" && pwd); break; }
done
if [ -n "$DATA_DIR" ]; then
  export LDM_DATA_DIR=$DATA_DIR
  [ "$REST" = 1 ] || row "data                       $DATA_DIR"
else
  [ "$REST" = 1 ] || row "data                       none: the GPU tests skip their data cases (copy ../shared/data to ./shared/data)"
fi
# benchmark data: FineWeb-Edu sample shards (or a synthetic shard without the data)
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
TOK_FLAG=()  # an array: the data path may hold spaces
[ -f "$DATA_DIR/gpt2_tokenizer/encoder.json" ] && TOK_FLAG=(--tokenizer "$DATA_DIR/gpt2_tokenizer")

bench() {  # bench <label> <extra flags...>: one --bench run of $TRAINER (at $BENCH_PRESET, or
  # the PRESET:T:B in $SHAPE when set)
  local label=$1; shift
  local bp=$BENCH_PRESET bt=$BENCH_T bb=$BENCH_B
  [ -n "${SHAPE:-}" ] && IFS=: read -r bp bt bb <<< "$SHAPE"
  done_before "bench $label" && return
  if [ ! -x "$TRAINER" ]; then
    row "$(printf 'bench %-20s FAIL  (%s not built)' "$label" "$TRAINER")"; FAILS=$((FAILS + 1)); return
  fi
  start_item "bench $label" "$BENCH_TIMEOUT" || return
  local log="$OUTDIR/bench_$label.log"
  timed "bench $label" "$log" "$TRAINER" --preset "$bp" -T "$bt" -B "$bb" --dtype bf16 \
    --bench "$BENCH_STEPS" --train-data "$TRAIN_GLOB" "${TOK_FLAG[@]}" --sample-every -1 --quiet "$@" || return
  local rc=$RC dt=$DT
  local line=$(grep '^BENCH ' "$log" | tail -1)
  if [ "$rc" = 0 ] && [ -n "$line" ]; then
    row "$(printf 'bench %-20s PASS  %s' "$label" "$(python3 -c '
import json, sys
j = json.loads(sys.argv[1][6:])
mfu = "MFU %.1f%% (peak %.0f TFLOP/s%s)" % (100 * j["mfu"], j["peak_bf16_tflops"],
    "; %.1f%% against the random-input peak %.0f" % (100 * j["mfu_random_peak"], j["peak_bf16_tflops_random"])
    if j.get("mfu_random_peak") else "") if j.get("mfu") else "MFU n/a (peak unknown)"
print("%.0f tok/s, %.1f ms/step, %s, peak mem %.1f GiB, scheme %d B/token" % (
    j["tokens_per_s"], j["step_ms"], mfu, j["peak_mem_gib"], j["scheme_bytes_per_token"]))' "$line" 2>/dev/null || echo "$line")")"
    printf '%s\t%s\n' "$label" "${line#BENCH }" >> "$OUTDIR/bench_lines.txt"
    # --profile-stages: its per-stage table goes into the summary too
    sed -n '/^stage breakdown/,/^  sum of the stages/p' "$log" | sed 's/^/    /' >> "$TABLE"
  elif grep -q "runs on the GPU in train_ldm\|trains --scheme ldm only" "$log"; then
    row "$(printf 'bench %-20s n/a   (scheme of the other GPU trainer)' "$label")"
  else
    FAILS=$((FAILS + 1))
    local why="$(grep -m1 'error' "$log")"
    is_timeout "$rc" && why="timeout ${ITEM_TIMEOUT}s"
    row "$(printf 'bench %-20s FAIL  exit %d, %d s: %s' "$label" "$rc" "$dt" "$why")"
  fi
}
ldm_bench() {  # ldm_bench <label> <flags...>: bench through train_ldm
  local saved=$TRAINER
  TRAINER="$BUILD/cuda/train_ldm"
  bench "$@"
  TRAINER=$saved
}

infer_bench() {  # prefill of T/2 tokens, then min(128, T/2) decode steps, B sequences (cuda/infer.cuh)
  done_before "bench infer-preln" && return
  if [ ! -x "$TRAINER" ]; then
    row "$(printf 'bench %-20s FAIL  (%s not built)' infer-preln "$TRAINER")"; FAILS=$((FAILS + 1)); return
  fi
  start_item "bench infer-preln" "$BENCH_TIMEOUT" || return
  local ilog="$OUTDIR/bench_infer_preln.log"
  timed "bench infer-preln" "$ilog" "$TRAINER" --preset "$BENCH_PRESET" -T "$BENCH_T" -B "$BENCH_B" --dtype bf16 \
    --scheme preln "${TOK_FLAG[@]}" --bench-infer "$((BENCH_T / 2)):$(( BENCH_T / 2 < 128 ? BENCH_T / 2 : 128 ))" || return
  local rc=$RC dt=$DT
  local iline=$(grep '^BENCH_INFER ' "$ilog" | tail -1)
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
}

# the PyTorch peer of the preln benchmark (scripts/torch_bench.py: the same model, bf16 autocast,
# SDPA; eager and torch.compile); rows "torch-<mode>" of the table (MFU against the C++ run's FLOPs
# per token and measured peak)
PEER_PY=""
PEER_PROBED=0
PEER_DEVICE=${PEER_DEVICE:-cuda}
peer() {  # peer <mode>
  local mode=$1 p probe='import torch; assert torch.cuda.is_available()'
  done_before "peer torch-$mode" && return
  local left=$(( BUDGET - ($(date +%s) - T0) ))
  if [ "$PEER_PROBED" = 0 ] && [ "$left" -ge "$MIN_ITEM" ]; then  # the first Python with (CUDA) PyTorch,
    # looked for once, within the budget (importing torch takes seconds; start_item below then
    # skips the item if the probe spent what was left)
    PEER_PROBED=1
    [ "$PEER_DEVICE" = cpu ] && probe='import torch'
    local pt=$(( left < 60 ? left : 60 ))
    for p in ${BENCH_PYTHON:-} python3 /usr/bin/python3; do
      if command -v "$p" > /dev/null && timeout -k 5 "$pt" "$p" -c "$probe" 2> /dev/null; then PEER_PY=$p; break; fi
    done
  fi
  [ "$PEER_PROBED" = 0 ] && { start_item "peer torch-$mode" "${PEER_TIMEOUT:-240}"; return; }  # budget spent: SKIP
  if [ -z "$PEER_PY" ]; then
    row "$(printf 'peer torch-%-15s n/a   (no Python with %sPyTorch)' "$mode" "$([ "$PEER_DEVICE" = cpu ] || echo 'CUDA ')")"
    return
  fi
  start_item "peer torch-$mode" "${PEER_TIMEOUT:-240}" || return
  local plog="$OUTDIR/peer_torch_$mode.log"
  timed "peer torch-$mode" "$plog" "$PEER_PY" scripts/torch_bench.py bench --device "$PEER_DEVICE" --mode "$mode" \
    --dtype bf16 --preset "$BENCH_PRESET" --scheme preln -B "$BENCH_B" -T "$BENCH_T" --steps "$BENCH_STEPS" --warmup 2 \
    --spec-bin "$BUILD/generate_cpu" || return
  local rc=$RC dt=$DT
  local pline=$(grep '^BENCH ' "$plog" | tail -1)
  if [ "$rc" = 0 ] && [ -n "$pline" ]; then
    local res=$(python3 - "$pline" "$OUTDIR/bench_lines.txt" "$mode" <<'PYEOF'
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
    local why="$(grep -m1 -i 'error' "$plog")"
    is_timeout "$rc" && why="timeout ${ITEM_TIMEOUT}s"
    row "$(printf 'peer torch-%-15s FAIL  exit %d, %d s: %s' "$mode" "$rc" "$dt" "$why")"
  fi
}

# 1. PreLN: correct against the CPU, then its numbers (MFU, the graph, where the step goes)
gpu_test test_gpu_train "$BUILD/test/test_gpu_train"
case " $SCHEMES " in *" preln "*) bench preln --scheme preln ;; esac
[ "${GRAPH_BENCH:-1}" = 1 ] && bench "preln-graph" --scheme preln --cuda-graph 1
if [ "${PROFILE_BENCH:-1}" = 1 ]; then  # doc/cuda.md "Per-stage profile"
  for s in ${PROFILE_SCHEMES:-preln}; do
    if [ "$s" = ldm ]; then ldm_bench "ldm-profile" --ldm-rule rls --ldm-mode unwind --profile-stages
    else bench "$s-profile" --scheme "$s" --profile-stages; fi
  done
fi
# 2. attention: every variant's TFLOP/s at the llama-400m and qwen3-1.7b shapes
workbenches attention
# 3. the depth schemes against PreLN
for s in $SCHEMES; do [ "$s" = preln ] || bench "$s" --scheme "$s"; done
if [ "${LDM_BENCH:-1}" != 0 ]; then
  ldm_bench "ldm-rls-unwind" --ldm-rule rls --ldm-mode unwind
  ldm_bench "ldm-rls-unwind-dk4" --ldm-rule rls --ldm-mode unwind --ldm-dk 4
fi
[ -n "$QWEN_SHAPE" ] && SHAPE=$QWEN_SHAPE bench "preln-${QWEN_SHAPE%%:*}" --scheme preln
# 4. the PyTorch peer
if [ "${TORCH_PEER:-1}" = 1 ]; then for mode in ${PEER_MODES:-eager compile}; do peer "$mode"; done; fi
# 5. the scheme kernels, then the schemes' trainer tests
workbenches ldm hc attnres
gpu_test test_gpu_schemes "$BUILD/test/test_gpu_schemes"
gpu_test test_gpu_ldm "$BUILD/test/test_gpu_ldm"
# 6. the rest of the workbenches and tests
for src in dev/cuda/*.cu; do workbenches "$(basename "$src" .cu)"; done
for bin in "$BUILD"/test/test_gpu_*; do
  case "$bin" in *.o|*.d) continue ;; esac
  name=$(basename "$bin")
  case " test_gpu_train test_gpu_schemes test_gpu_ldm " in *" $name "*) continue ;; esac
  gpu_test "$name" "$bin"
done
# the data-parallel GPU case of test_dist (one GPU: --nccl ZeRO-0/1, overlap on/off == plain)
[ -x "$BUILD/test/test_dist" ] && gpu_test "test_dist[gpu]" "$BUILD/test/test_dist" "[gpu]"
# 7. the remaining benches
[ "${LDM_BENCH:-1}" != 0 ] && ldm_bench "ldm-rls-window4" --ldm-rule rls --ldm-mode window --ldm-window 4
if [ "${NCCL_BENCH:-1}" = 1 ]; then  # cost of the NCCL path on one GPU (target <= 2% over preln)
  bench "preln-nccl-z1-flat" --scheme preln --nccl --zero 1 --nccl-overlap 0
  bench "preln-nccl-z1-overlap" --scheme preln --nccl --zero 1 --nccl-overlap 1
fi
[ "${RECOMPUTE_BENCH:-0}" = 1 ] && bench "preln-recompute2" --scheme preln --recompute 2
[ "${INFER_BENCH:-1}" = 1 ] && infer_bench

gpu_state end

# ---- the tables, at the end: the summary, the targets, the status rows and totals last
echo
echo "================ gpu_check: $GPU_DESC ================"
cat "$TABLE"
if [ -f "$OUTDIR/bench_lines.txt" ]; then
  python3 - "$OUTDIR/bench_lines.txt" <<'EOF' || cat "$OUTDIR/bench_lines.txt"
import json, sys
rows = [l.rstrip("\n").split("\t", 1) for l in open(sys.argv[1]) if "\t" in l]
rows = [(k, json.loads(v)) for k, v in rows]
base = dict(rows).get("preln")
shape = lambda j: (j.get("preset"), j.get("T"), j.get("B"))
print("%-22s %10s %9s %6s %9s %12s %12s" % ("benchmark", "tok/s", "ms/step", "MFU", "mem GiB", "tok/s/preln", "mem/preln"))
for k, j in rows:
    same = base and shape(j) == shape(base)  # ratios only at preln's shape
    rel_t = "%.3f" % (j["tokens_per_s"] / base["tokens_per_s"]) if same else "-"
    rel_m = "%.3f" % (j["peak_mem_gib"] / base["peak_mem_gib"]) if same else "-"
    mfu = "%5.1f%%" % (100 * j["mfu"]) if j.get("mfu") else "%6s" % "-"
    print("%-22s %10.0f %9.1f %s %9.1f %12s %12s" % (k, j["tokens_per_s"], j["step_ms"], mfu, j["peak_mem_gib"],
                                                    rel_t, rel_m))
EOF
fi
# every target of the spec (and issues #17, #18): met, missed or not measured, from the rows above
python3 scripts/gpu_targets.py "$OUTDIR" --out "$OUTDIR/targets.md" 2>&1 || echo "gpu_check: gpu_targets.py failed"
# the status rows again, so that the last lines of the output (all a device call returns) hold them
echo "---- status rows (the indented CHECK/BENCH lines above and in $OUTDIR)"
grep -v '^    ' "$TABLE"
if [ -n "${PACK:-}" ]; then  # every log in one file (a device call brings back only a few files)
  tar -czf "$PACK" -C "$OUTDIR" --exclude=bench_data . && echo "logs packed into $PACK"
  # the targets also as a file of their own beside PACK (in a device call's $OUT: it comes back)
  [ -f "$OUTDIR/targets.md" ] && cp "$OUTDIR/targets.md" "$(dirname "$PACK")/targets.md" &&
    echo "targets table: $(dirname "$PACK")/targets.md"
fi
echo "total $(( $(date +%s) - T0 )) s; logs in $OUTDIR; $([ "$FAILS" = 0 ] && echo 'ALL PASS' || echo "$FAILS FAILED")$([ "$SKIPPED" != 0 ] && echo ", $SKIPPED SKIPPED (time budget)")"
[ "$FAILS" = 0 ]
