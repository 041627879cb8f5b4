#!/usr/bin/env bash
# README command 1 (`make demo` runs scripts/install_deps.sh and builds first): trains the
# `small` model on the CPU on the FineWeb-Edu sample and shows that it learns.
#   1. finds the FineWeb-Edu sample: $LDM_DATA_DIR, else ../shared/data, else downloads it
#      (scripts/download_data.sh) into $LDM_DATA_DIR or ../shared/data;
#   2. tokenizes it (GPT-2) into shards with build/ldm_data: the first 15 documents are the
#      validation shard, the rest the training shard;
#   3. trains `small` (29M parameters, 25.8M of them in the untied embedding/LM head) for
#      DEMO_STEPS steps of B x T tokens on all cores (~5 minutes on 2 cores);
#   4. prints the validation loss next to the unigram baseline (cross-entropy of the same val
#      tokens under an add-one unigram model fitted on the train tokens) and a text sample, and
#      fails (exit 1) unless the model is clearly (>= 0.2 nats) below the baseline.
#   5. builds the LAMBADA, WikiText-2 and HellaSwag eval binaries and evaluates the final
#      checkpoint with build/eval_cpu on the first DEMO_EVAL_EXAMPLES examples of each
#      (WikiText-2: the first 3 documents), printing the table and writing eval.json.
# Output (checkpoint, JSONL log, console log, eval.json) in $DEMO_OUT (default demo_out/).
# Environment: BUILD (build dir, default build), DEMO_OUT, DEMO_STEPS, DEMO_B, DEMO_T, DEMO_LR,
# DEMO_THREADS (0 = all cores), DEMO_EVAL_EXAMPLES (default 200; 0 skips step 5).
set -euo pipefail
case "${1:-}" in -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;; esac
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
OUT=${DEMO_OUT:-demo_out}
STEPS=${DEMO_STEPS:-200}
B=${DEMO_B:-8}
T=${DEMO_T:-128}
LR=${DEMO_LR:-2e-3}
THREADS=${DEMO_THREADS:-0}
EVAL_EXAMPLES=${DEMO_EVAL_EXAMPLES:-200}
# idle OpenMP threads sleep instead of spinning (much faster when cores are shared)
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}

for bin in "$BUILD/ldm_data" "$BUILD/train_cpu" "$BUILD/eval_cpu"; do
  [ -x "$bin" ] || { echo "demo: $bin missing; run 'make' (or 'make demo') first" >&2; exit 1; }
done

# 1. data
DATA=""
for d in "${LDM_DATA_DIR:-}" ../shared/data; do
  if [ -n "$d" ] && [ -f "$d/fineweb_edu_sample/fineweb_edu_sample.jsonl" ] && [ -f "$d/gpt2_tokenizer/encoder.json" ]; then
    DATA=$d; break
  fi
done
if [ -n "$DATA" ]; then
  INPUT="$DATA/fineweb_edu_sample/fineweb_edu_sample.jsonl"
else
  DATA=${LDM_DATA_DIR:-../shared/data}
  echo "demo: no FineWeb-Edu sample found; downloading into $DATA (scripts/download_data.sh)"
  mkdir -p "$DATA"
  bash scripts/download_data.sh gpt2-tokenizer fineweb-edu --max-files 1 --out "$DATA"
  INPUT="$DATA/fineweb_edu_10BT/*.jsonl"
fi
echo "demo: data from $INPUT"

# 2. shards
mkdir -p "$OUT"
rm -rf "$OUT/data"
"$BUILD/ldm_data" shards --tokenizer "$DATA/gpt2_tokenizer" --input "$INPUT" \
  --out-dir "$OUT/data" --name fineweb --val-docs 15 --quiet

# 3. train
rm -rf "$OUT/run"
mkdir -p "$OUT/run"
start=$(date +%s)
"$BUILD/train_cpu" --preset small -B "$B" -T "$T" --steps "$STEPS" --lr "$LR" --warmup-steps 20 \
  --schedule cosine --min-lr-ratio 0.1 --weight-decay 0.1 --threads "$THREADS" \
  --train-data "$OUT/data/fineweb_train_*.bin" --val-data "$OUT/data/fineweb_val_*.bin" \
  --tokenizer "$DATA/gpt2_tokenizer" --val-every 50 --val-batches 9 --unigram-baseline \
  --sample-every 0 --sample-tokens 64 --quiet --seed 1337 \
  --out-dir "$OUT/run" --log "$OUT/run/log.jsonl" | tee "$OUT/run/console.txt"
secs=$(( $(date +%s) - start ))

# 4. verdict, from the JSONL log
read -r val uni < <(grep '"type":"val"' "$OUT/run/log.jsonl" | tail -1 | \
  sed -E 's/.*"unigram_loss":([-0-9.e+]+).*"val_loss":([-0-9.e+]+).*/\2 \1/')
echo
echo "demo: trained small for $STEPS steps of $((B*T)) tokens in ${secs} s"
printf "demo: validation loss  %.4f nats/token\n" "$val"
printf "demo: unigram entropy  %.4f nats/token (add-one unigram of the train tokens, on the same val tokens)\n" "$uni"
echo "demo: checkpoint and log in $OUT/run/ (ckpt_$(printf %06d "$STEPS").model/.state, log.jsonl)"
if awk -v v="$val" -v u="$uni" 'BEGIN { exit !(v + 0.2 <= u) }'; then
  verdict="PASS: validation loss is $(awk -v v="$val" -v u="$uni" 'BEGIN{printf "%.3f", u - v}') nats below the unigram entropy"
  ok=1
else
  verdict="FAIL: validation loss is not clearly below the unigram entropy"
  ok=0
fi

# 5. evaluation of the final checkpoint on the standard benchmarks (subsets: CPU time)
if [ "$EVAL_EXAMPLES" -gt 0 ] && [ -f "$DATA/lambada/lambada_test.jsonl" ]; then
  mkdir -p "$OUT/eval"
  TOK="$DATA/gpt2_tokenizer"
  "$BUILD/ldm_data" lambada --tokenizer "$TOK" --input "$DATA/lambada/lambada_test.jsonl" --out "$OUT/eval/lambada.bin" >/dev/null
  "$BUILD/ldm_data" wikitext --tokenizer "$TOK" --input "$DATA/wikitext2/wiki.test.raw" --out "$OUT/eval/wikitext2.bin" >/dev/null
  hs=()
  if [ -f "$DATA/hellaswag/hellaswag_val_full.txt.bz2" ]; then
    "$BUILD/ldm_data" hellaswag --tokenizer "$TOK" --input "$DATA/hellaswag/hellaswag_val_full.txt.bz2" --out "$OUT/eval/hellaswag.bin" >/dev/null
    hs=(--hellaswag "$OUT/eval/hellaswag.bin")
  fi
  echo
  echo "demo: evaluating the checkpoint (first $EVAL_EXAMPLES LAMBADA examples / HellaSwag items, first 3 WikiText-2 documents)"
  "$BUILD/eval_cpu" --checkpoint "$OUT/run/ckpt_$(printf %06d "$STEPS").model" --tokenizer "$TOK" \
    --val-data "$OUT/data/fineweb_val_*.bin" --lambada "$OUT/eval/lambada.bin" \
    --wikitext "$OUT/eval/wikitext2.bin" --max-docs 3 "${hs[@]}" --max-examples "$EVAL_EXAMPLES" \
    --threads "$THREADS" --out "$OUT/run/eval.json"
fi
echo
echo "demo: $verdict"
[ "$ok" = 1 ] || exit 1
