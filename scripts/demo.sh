#!/usr/bin/env bash
# README command 1 (`make demo` = scripts/install_deps.sh --no-npm, then this with --build):
# PreLN and LDM trained side by side on the CPU, byte-level, on tiny Shakespeare, with the same
# data order, steps and seeds; prints what came out. About 10 minutes on 2 cores including the
# build (measured: doc/results_cpu.md "make demo"). Needs no network when the data is local.
#   0. with --build: builds the CPU tools (make cpu), timed;
#   1. finds tiny Shakespeare, LAMBADA and WikiText-2 in $LDM_DATA_DIR, else ../shared/data, else
#      downloads them (scripts/download_data.sh, needs internet);
#   2. runs scripts/study.sh --recipe demo: byte-level shards (first 100,000 bytes = validation),
#      `small` at d=128 (4 layers, 1.7M parameters), B=16 x T=128, DEMO_STEPS steps, lr 3e-3
#      cosine, for each seed and scheme; eval_cpu on the first DEMO_EVAL_EXAMPLES LAMBADA examples
#      and the first 2 WikiText-2 documents (byte-level binaries); a 200-byte sample per model;
#   3. prints the table (final val loss mean and seed range, WikiText-2, LAMBADA, tokens/s, peak
#      memory), the verdict computed from those numbers, one sample per scheme, the plot's path
#      and the times; fails (exit 1) if a run failed or a model is not clearly (0.5 nats) below
#      the unigram entropy of the bytes (then it did not learn).
# Output in $DEMO_OUT (default demo_out/, git-ignored): study/summary.md, summary.csv,
# losses.png, plots/, runs/<scheme>_lr<LR>_s<seed>/ (logs, eval.json, sample.txt).
# Environment: DEMO_STEPS (600), DEMO_SEEDS ("1 2"; "1 2 3" for a third seed, +5 minutes on 2
# cores), DEMO_SCHEMES ("preln ldm"; e.g.
# "preln ldm mhc attnres-block2"), DEMO_LR (3e-3), DEMO_B (16), DEMO_T (128), DEMO_THREADS
# (0 = all cores), DEMO_EVAL_EXAMPLES (200; 0 skips LAMBADA/WikiText-2), DEMO_OUT, DEMO_RESUME=1
# (keep the runs of an earlier demo with the same settings instead of starting over; otherwise
# the earlier demo's study/ is moved to study.prev/), BUILD. Bad DEMO_* values stop it at once.
set -euo pipefail
case "${1:-}" in -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;; esac
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
t_start=$(date +%s)
BUILD=${BUILD:-$ROOT/build}
OUT=${DEMO_OUT:-$ROOT/demo_out}
STEPS=${DEMO_STEPS:-600}
SEEDS=${DEMO_SEEDS:-1 2}
SCHEMES=${DEMO_SCHEMES:-preln ldm}
LR=${DEMO_LR:-3e-3}
B=${DEMO_B:-16}
T=${DEMO_T:-128}
THREADS=${DEMO_THREADS:-0}
EVAL_EXAMPLES=${DEMO_EVAL_EXAMPLES:-200}
# the settings are checked before anything is built, downloaded or replaced
is_uint() { [[ "$1" =~ ^[0-9]+$ ]]; }
for n in STEPS B T THREADS EVAL_EXAMPLES; do
  v=${!n}
  is_uint "$v" || { echo "demo: error: DEMO_$n must be a non-negative integer, got '$v'" >&2; exit 2; }
  case $n in STEPS|B|T) [ "$v" -gt 0 ] || { echo "demo: error: DEMO_$n must be at least 1" >&2; exit 2; } ;; esac
done
for s in $SEEDS; do is_uint "$s" || { echo "demo: error: DEMO_SEEDS must hold integers, got '$s'" >&2; exit 2; }; done
[ -n "${SEEDS// /}" ] || { echo "demo: error: DEMO_SEEDS is empty" >&2; exit 2; }
[ -n "${SCHEMES// /}" ] || { echo "demo: error: DEMO_SCHEMES is empty" >&2; exit 2; }
[[ "$LR" =~ ^[0-9]*\.?[0-9]+([eE][-+]?[0-9]+)?$ ]] || { echo "demo: error: DEMO_LR must be a number, got '$LR'" >&2; exit 2; }
# idle OpenMP threads sleep instead of spinning (much faster when cores are shared)
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}

build_s=0
if [ "${1:-}" = --build ]; then
  echo "demo: building the CPU tools (make cpu, $(nproc) jobs)"
  t0=$(date +%s)
  make -C "$ROOT" --no-print-directory -j"$(nproc)" cpu
  build_s=$(( $(date +%s) - t0 ))
  echo "demo: build took ${build_s} s"
fi
for bin in ldm_data train_cpu eval_cpu generate_cpu; do
  [ -x "$BUILD/$bin" ] || { echo "demo: $BUILD/$bin missing; run 'make demo' (or 'make cpu') first" >&2; exit 1; }
done

# 1. data
DATA=""
for d in "${LDM_DATA_DIR:-}" "$ROOT/../shared/data" "$OUT/data"; do
  if [ -n "$d" ] && [ -f "$d/tinyshakespeare/input.txt" ]; then DATA=$(cd "$d" && pwd); break; fi
done
if [ -z "$DATA" ]; then
  # (not into ../shared/data: a partial copy there would be taken by the tests for the full one)
  DATA=${LDM_DATA_DIR:-$OUT/data}
  echo "demo: no tiny Shakespeare found; downloading it, LAMBADA and WikiText-2 into $DATA (scripts/download_data.sh)"
  mkdir -p "$DATA"
  bash "$ROOT/scripts/download_data.sh" tinyshakespeare lambada wikitext2 --out "$DATA"
  DATA=$(cd "$DATA" && pwd)
fi
echo "demo: data from $DATA"

# 2. the comparison
study="$OUT/study"
# a new demo starts over; the previous one's study is kept as study.prev (DEMO_RESUME=1 continues it)
if [ "${DEMO_RESUME:-0}" != 1 ] && [ -e "$study" ]; then
  rm -rf "$study.prev" && mv "$study" "$study.prev"
  echo "demo: the previous demo's results moved to $study.prev"
fi
mkdir -p "$OUT"
threads=()
[ "$THREADS" != 0 ] && threads=(--threads "$THREADS")
evals=(--eval-max-examples "$EVAL_EXAMPLES")
[ "$EVAL_EXAMPLES" = 0 ] && evals=(--no-eval)
echo "demo: schemes '$SCHEMES' x seeds '$SEEDS': $STEPS steps of B=$B x T=$T bytes each (DEMO_* to change)"
t0=$(date +%s)
set +e
# the study in a process group of its own (a background job here would ignore Ctrl-C): Ctrl-C on
# the demo stops it and its trainer through the trap (each says where it stopped)
LDM_DATA_DIR="$DATA" BUILD="$BUILD" setsid bash "$ROOT/scripts/study.sh" --recipe demo --out "$study" --bin "$BUILD" \
  --schemes "$SCHEMES" --seeds "$SEEDS" --lrs "$LR" --steps "$STEPS" -B "$B" -T "$T" "${threads[@]}" "${evals[@]}" \
  -- --unigram-baseline > "$OUT/study_console.txt" 2>&1 &
pid=$!
trap 'kill -TERM -- -"$pid" 2>/dev/null; wait "$pid"; tail -n 2 "$OUT/study_console.txt" >&2
      echo "demo: interrupted; DEMO_RESUME=1 make demo continues it" >&2; exit 130' INT TERM
# progress: one line per finished run (the study's own lines, the rest is in study_console.txt)
tail -n +1 -f "$OUT/study_console.txt" --pid=$pid 2>/dev/null | grep --line-buffered -E "^study: \[|^study:   .*(: step |final val loss)|FAILED|^study: .* runs done" &
tailpid=$!
wait $pid
rc=$?
wait $tailpid 2>/dev/null   # tail --pid ends after the study's last lines
set -e
study_s=$(( $(date +%s) - t0 ))
[ -f "$study/summary.md" ] || { echo "demo: the study did not finish (exit $rc); see $OUT/study_console.txt" >&2; exit 1; }

# 3. what came out
echo
sed -n '/^## Per scheme/,/^## Per run/p' "$study/summary.md" | sed '$d'
# each model against the unigram entropy of the bytes (logged by --unigram-baseline)
health=$(/usr/bin/python3 - "$study" <<'PY'
import glob, json, os, sys
bad, n, gap = [], 0, None
for log in sorted(glob.glob(os.path.join(sys.argv[1], "runs", "*", "log.jsonl"))):
    uni = val = None
    for line in open(log):
        e = json.loads(line)
        if e.get("type") == "unigram": uni = e["unigram_loss"]
        if e.get("type") == "val": val = e["val_loss"]
    if uni is None or val is None: continue
    n += 1
    gap = uni - val if gap is None else min(gap, uni - val)
    if val > uni - 0.5: bad.append(os.path.basename(os.path.dirname(log)))
print("%d %s %s" % (n, "%.3f" % gap if gap is not None else "-", ",".join(bad) or "-"))
PY
)
read -r n_health min_gap bad_runs <<< "$health"
echo
echo "demo: samples (prompt 'ROMEO:', top-p 0.9, temperature 0.8; first seed of each scheme):"
for s in $SCHEMES; do
  f=$(ls "$study"/runs/"${s}"_lr*_s*/sample.txt 2>/dev/null | head -n 1 || true)
  [ -n "$f" ] || continue
  echo "--- $s ($(basename "$(dirname "$f")"))"
  head -c 400 "$f"; echo
done
echo "---"
echo
echo "demo: loss curves: $study/losses.png (per run: $study/plots/); full report: $study/summary.md"
total_s=$(( $(date +%s) - t_start ))
echo "demo: time: build ${build_s} s, training + evaluation ${study_s} s, total ${total_s} s ($(nproc) cores)"
ok=1
if [ "$rc" != 0 ]; then echo "demo: FAIL: a run failed (exit $rc); see $OUT/study_console.txt" >&2; ok=0; fi
if [ "$n_health" = 0 ]; then
  echo "demo: FAIL: no finished run to check" >&2; ok=0
elif [ "$bad_runs" != "-" ]; then
  echo "demo: FAIL: not clearly below the unigram entropy of the bytes (did not learn): $bad_runs" >&2; ok=0
else
  echo "demo: every model is at least $min_gap nats below the unigram entropy of the bytes (it learned)"
fi
echo
sed 's/^/VERDICT: /' "$study/verdict.txt"
[ "$ok" = 1 ] || exit 1
