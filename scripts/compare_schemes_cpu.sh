#!/usr/bin/env bash
# Trains the same model under every depth-aggregation scheme on the CPU (same seed, data and
# data order, same number of steps) and writes two tables:
#   OUT/train_table.md   scheme, final validation loss, median tokens/s, ms/step
#   OUT/eval_table.md/.csv  scripts/eval_checkpoints.sh over the final checkpoints
#                        (val ppl, WikiText-2 word ppl, LAMBADA ppl/acc, HellaSwag acc_norm)
# plus OUT/losses.png (scripts/plot_losses.py) and each run's log under OUT/<scheme>/.
#
#   scripts/compare_schemes_cpu.sh [--out DIR] [--preset small] [--steps 60] [-B 8] [-T 128]
#        [--lr 2e-3] [--schemes "preln hc mhc attnres-full attnres-block2 ldm-rls ..."]
#        [--eval-max-examples N]
# Scheme names: preln hc mhc attnres-full attnres-block (N = 8 blocks: on the 4-layer presets
# that is Full) attnres-block2 (N = 2, the default list's) ldm-rls ldm-delta ldm-outer
# ldm-rls-nores (LDM rls --no-residual); an unknown one is refused before any work. Data: the FineWeb-Edu sample (GPT-2 tokens), from
# $LDM_DATA_DIR or ../shared/data next to the checkout. Needs `make` first. Relative paths are
# taken from the directory it is run in. Only each run's final model file is kept (~115 MB per
# scheme on `small`): the script never resumes, so the optimizer state (.state, twice that) is
# deleted. One seed, no resume, GPT-2 vocabulary: scripts/study.sh is the general tool (seeds,
# LR sweeps, resumable, any trainer) and scripts/demo.sh the byte-level comparison.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BUILD=${BUILD:-$ROOT/build}
OUT=compare_out; PRESET=small; STEPS=60; B=8; T=128; LR=2e-3; EVAL_MAX=100
SCHEMES="preln hc mhc attnres-full attnres-block2 ldm-rls ldm-delta ldm-outer ldm-rls-nores"
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT=$2; shift 2 ;; --preset) PRESET=$2; shift 2 ;; --steps) STEPS=$2; shift 2 ;;
    -B) B=$2; shift 2 ;; -T) T=$2; shift 2 ;; --lr) LR=$2; shift 2 ;;
    --schemes) SCHEMES=$2; shift 2 ;; --eval-max-examples) EVAL_MAX=$2; shift 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "error: unknown argument $1" >&2; exit 2 ;;
  esac
done
scheme_flags() {
  case "$1" in
    preln|hc|mhc|attnres-full|attnres-block) echo "--scheme $1" ;;
    attnres-block2) echo "--scheme attnres-block --attnres-blocks 2" ;;
    ldm|ldm-rls) echo "--scheme ldm --ldm-rule rls" ;;   # (ldm: study.sh's name of the default rule)
    ldm-delta) echo "--scheme ldm --ldm-rule delta" ;;
    ldm-outer) echo "--scheme ldm --ldm-rule outer" ;;
    ldm-rls-nores) echo "--scheme ldm --ldm-rule rls --no-residual" ;;
    *) echo "error: unknown scheme name $1 (known: preln hc mhc attnres-full attnres-block attnres-block2 ldm" \
         "ldm-rls ldm-delta ldm-outer ldm-rls-nores)" >&2; return 1 ;;
  esac
}
# every scheme name is checked before any work
for s in $SCHEMES; do scheme_flags "$s" > /dev/null || exit 2; done
for bin in ldm_data train_cpu eval_cpu; do
  [ -x "$BUILD/$bin" ] || { echo "error: $BUILD/$bin missing; run make first" >&2; exit 1; }
done
DATA=""
for d in "${LDM_DATA_DIR:-}" "$ROOT/../shared/data"; do
  if [ -n "$d" ] && [ -f "$d/fineweb_edu_sample/fineweb_edu_sample.jsonl" ]; then DATA=$d; break; fi
done
[ -n "$DATA" ] || { echo "error: no FineWeb-Edu sample (set LDM_DATA_DIR or run scripts/download_data.sh)" >&2; exit 1; }
TOK="$DATA/gpt2_tokenizer"
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}

mkdir -p "$OUT/data" "$OUT/eval"
if [ ! -f "$OUT/data/fineweb_val_000000.bin" ]; then
  "$BUILD/ldm_data" shards --tokenizer "$TOK" --input "$DATA/fineweb_edu_sample/fineweb_edu_sample.jsonl" \
    --out-dir "$OUT/data" --name fineweb --val-docs 15 --quiet
fi
[ -f "$OUT/eval/lambada.bin" ] || "$BUILD/ldm_data" lambada --tokenizer "$TOK" \
  --input "$DATA/lambada/lambada_test.jsonl" --out "$OUT/eval/lambada.bin" >/dev/null
[ -f "$OUT/eval/wikitext2.bin" ] || "$BUILD/ldm_data" wikitext --tokenizer "$TOK" \
  --input "$DATA/wikitext2/wiki.test.raw" --out "$OUT/eval/wikitext2.bin" >/dev/null
HS_SRC="$DATA/hellaswag/hellaswag_val.jsonl"   # scripts/download_data.sh's file, else the shared .bz2
[ -f "$HS_SRC" ] || HS_SRC="$DATA/hellaswag/hellaswag_val_full.txt.bz2"
[ -f "$OUT/eval/hellaswag.bin" ] || "$BUILD/ldm_data" hellaswag --tokenizer "$TOK" \
  --input "$HS_SRC" --out "$OUT/eval/hellaswag.bin" >/dev/null


ckpts=(); logs=()
printf '| scheme | final val loss | median tokens/s | median ms/step |\n|---|---|---|---|\n' > "$OUT/train_table.md"
for s in $SCHEMES; do
  flags=$(scheme_flags "$s")
  rm -rf "$OUT/$s"; mkdir -p "$OUT/$s"
  echo "=== $s: train_cpu --preset $PRESET $flags (steps $STEPS, B $B, T $T)"
  # shellcheck disable=SC2086
  "$BUILD/train_cpu" --preset "$PRESET" $flags -B "$B" -T "$T" --steps "$STEPS" --lr "$LR" \
    --warmup-steps $((STEPS / 10 + 1)) --schedule cosine --seed 1337 --quiet \
    --train-data "$OUT/data/fineweb_train_*.bin" --val-data "$OUT/data/fineweb_val_*.bin" \
    --tokenizer "$TOK" --val-every 0 --val-batches 9 --sample-every -1 \
    --out-dir "$OUT/$s" --log "$OUT/$s/log.jsonl" > "$OUT/$s/console.txt"
  final="$OUT/$s/ckpt_$(printf %06d "$STEPS")"
  rm -f "$final".state "$final".done  # the model file is all the evaluation needs
  row=$(/usr/bin/python3 - "$OUT/$s/log.jsonl" "$s" <<'PY'
import json, statistics, sys
steps, val = [], None
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r.get("type") == "step": steps.append(r)
    if r.get("type") == "val": val = r["val_loss"]
tps = statistics.median(r["tokens_per_s"] for r in steps[2:] or steps)
ms = statistics.median(r["ms"] for r in steps[2:] or steps)
print(f"| {sys.argv[2]} | {val:.4f} | {tps:.0f} | {ms:.0f} |")
PY
)
  echo "$row" | tee -a "$OUT/train_table.md"
  ckpts+=("$OUT/$s/ckpt_$(printf %06d "$STEPS").model"); logs+=("$OUT/$s/log.jsonl")
done

echo "=== evaluating ${#ckpts[@]} checkpoints"
bash "$ROOT/scripts/eval_checkpoints.sh" --out "$OUT/eval_table" --bin "$BUILD" --eval-dir "$OUT/eval" \
  --val-data "$OUT/data/fineweb_val_*.bin" --extra "--max-examples $EVAL_MAX --max-docs 3 --max-length $T" "${ckpts[@]}"
/usr/bin/python3 "$ROOT/scripts/plot_losses.py" --out "$OUT/losses.png" --smooth 0.8 "${logs[@]}" || echo "warning: plot failed"
echo; cat "$OUT/train_table.md"; echo; cat "$OUT/eval_table.md"
