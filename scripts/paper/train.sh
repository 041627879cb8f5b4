#!/usr/bin/env bash
# One training run of the paper's recipe on 1..N nodes of 8 GPUs, with an auto-resume loop:
# before every (re)start it resumes from the newest COMPLETE checkpoint (the newest
# ckpt_<step>.done marker in the run directory; a checkpoint without its marker is ignored), and
# it restarts after a failure up to --max-restarts times, but not after a divergence (resume is
# bit-exact, so it would diverge again). The console is also appended to DIR/console.txt.
# See doc/distributed.md.
#
#   scripts/paper/train.sh --size 400m|1.5b --scheme S --lr LR --out DIR [options]
#
#   --size 400m|1.5b      llama-400m (47,684 steps) or qwen-1.5b (94,972 steps), 2^20 tokens/step
#   --scheme S            preln | hc | mhc | attnres-full | attnres-block | ldm
#   --lr LR               peak learning rate (warmup 1% of the steps, cosine to 0.1 x peak)
#   --n-layer L --d-model D   aspect-ratio override (n_head = D/64, ffn = 2.75 D rounded to 32)
#   --ldm-dk K            LDM key size (the paper's 400M LDM uses 4)
#   --out DIR             run directory (checkpoints, log.jsonl); the run is named after it
#   --data DIR            token shards DIR/*train*.bin, DIR/*val*.bin (default $LDM_DATA_DIR/fineweb,
#                         else <checkout>/../shared/data/fineweb)
#   --tokenizer P         tokenizer dir or tokenizer.json (default: the trainer's)
#   --nodes N             nodes (default 1); --gpus-per-node G (default 8)
#   --launcher mpirun|srun   (default mpirun; srun uses --mpi=pmix)
#   --hostfile F          mpirun hostfile
#   --zero 0|1            ZeRO-1 sharding of the AdamW state (default 1)
#   --ckpt-every N        checkpoint interval in steps (default 1000)
#   --max-restarts K      restarts after a failure (default 20)
#   --bin DIR             directory of the CUDA trainers (default <repo>/build/cuda)
#   --dry-run             print the command(s) that would run, run nothing
#   -- ARGS               more trainer flags
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/common.sh"
root="$(cd "$here/../.." && pwd)"

SIZE="" SCHEME="" LR="" OUT="" DATA="${LDM_DATA_DIR:-$root/../shared/data}/fineweb" TOKENIZER=""
NODES=1 GPUS_PER_NODE=8 LAUNCHER=mpirun HOSTFILE="" ZERO=1 CKPT_EVERY=1000 MAX_RESTARTS=20
BIN="$root/build/cuda" DRY_RUN=0 NLAYER="" DMODEL="" DK="" EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --size) SIZE="${2:?}"; shift 2 ;;
    --scheme) SCHEME="${2:?}"; shift 2 ;;
    --lr) LR="${2:?}"; shift 2 ;;
    --n-layer) NLAYER="${2:?}"; shift 2 ;;
    --d-model) DMODEL="${2:?}"; shift 2 ;;
    --ldm-dk) DK="${2:?}"; shift 2 ;;
    --out) OUT="${2:?}"; shift 2 ;;
    --data) DATA="${2:?}"; shift 2 ;;
    --tokenizer) TOKENIZER="${2:?}"; shift 2 ;;
    --nodes) NODES="${2:?}"; shift 2 ;;
    --gpus-per-node) GPUS_PER_NODE="${2:?}"; shift 2 ;;
    --launcher) LAUNCHER="${2:?}"; shift 2 ;;
    --hostfile) HOSTFILE="${2:?}"; shift 2 ;;
    --zero) ZERO="${2:?}"; shift 2 ;;
    --ckpt-every) CKPT_EVERY="${2:?}"; shift 2 ;;
    --max-restarts) MAX_RESTARTS="${2:?}"; shift 2 ;;
    --bin) BIN="${2:?}"; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) sed -n '2,28p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --) shift; EXTRA=("$@"); break ;;
    *) die "unknown flag $1" ;;
  esac
done
[ -n "$SIZE" ] || die "--size is required"
[ -n "$SCHEME" ] || die "--scheme is required"
[ -n "$LR" ] || die "--lr is required"
[ -n "$OUT" ] || die "--out is required"
recipe_for "$SIZE"
case "$SCHEME" in
  preln|hc|mhc|attnres-full|attnres-block) TRAINER="$BIN/train_gpt_baselines" ;;
  ldm) TRAINER="$BIN/train_ldm" ;;
  *) die "unknown --scheme $SCHEME" ;;
esac
WORLD=$((NODES * GPUS_PER_NODE))
B=$(micro_batch_for "$WORLD")
launcher_cmd "$WORLD" > /dev/null   # an unknown --launcher stops here
MODEL=(--preset "$PRESET" --scheme "$SCHEME")
if [ -n "$NLAYER" ]; then MODEL+=(--n-layer "$NLAYER"); fi
if [ -n "$DMODEL" ]; then
  ffn=$(( (DMODEL * 11 / 4 + 31) / 32 * 32 ))
  MODEL+=(--d-model "$DMODEL" --n-head $((DMODEL / 64)) --n-kv-head $((DMODEL / 64)) --head-dim 64 --ffn "$ffn")
fi
if [ -n "$DK" ]; then MODEL+=(--ldm-dk "$DK"); fi
TOK=()
if [ -n "$TOKENIZER" ]; then TOK=(--tokenizer "$TOKENIZER"); fi

cmd_for() {  # $1 = resume base or "" (then --resume auto: a fresh start, or the restart of a run
  # that failed before its first checkpoint, whose log the trainer would otherwise refuse to replace).
  # Sets CMD (the words; the shard globs stay unexpanded for the trainer).
  local launch
  read -r -a launch <<< "$(launcher_cmd "$WORLD")"
  CMD=("${launch[@]}" "$TRAINER" "${MODEL[@]}" -B "$B" -T "$SEQ_LEN" --total-batch-tokens "$TOKENS_PER_STEP"
       --steps "$STEPS" --lr "$LR" --warmup-steps "$WARMUP" --schedule cosine --min-lr-ratio 0.1 --dtype bf16
       --zero "$ZERO" --train-data "$DATA/*train*.bin" --val-data "$DATA/*val*.bin" ${TOK[@]+"${TOK[@]}"} --val-every 1000
       --val-batches 20 --ckpt-every "$CKPT_EVERY" --out-dir "$OUT" --log "$OUT/log.jsonl" --quiet
       --resume "${1:-auto}" ${EXTRA[@]+"${EXTRA[@]}"})
}

if [ "$DRY_RUN" = 1 ]; then
  echo "# run $OUT: $SIZE $SCHEME lr $LR, $NODES node(s) x $GPUS_PER_NODE GPUs, B=$B per GPU," \
       "accumulation $((SEQS_PER_STEP / WORLD / B)), $STEPS steps, resume from: $(latest_marker "$OUT")"
  cmd_for "$(latest_marker "$OUT")"
  quote_words "${CMD[@]}"
  exit 0
fi

mkdir -p "$OUT"
final=$(printf '%s/ckpt_%06d' "$OUT" "$STEPS")
restarts=0
while :; do
  if [ -f "$final.done" ]; then echo "train.sh: $OUT complete ($final)"; exit 0; fi
  resume=$(latest_marker "$OUT")
  [ -n "$resume" ] && echo "train.sh: resuming $OUT from $resume" >&2
  cmd_for "$resume"
  # the console also goes to console.txt: a divergence is deterministic (bit-exact resume), so it
  # is not retried
  lines0=0
  [ -f "$OUT/console.txt" ] && lines0=$(wc -l < "$OUT/console.txt")
  set +e
  run_or_print "${CMD[@]}" 2>&1 | tee -a "$OUT/console.txt"
  rc=${PIPESTATUS[0]}
  set -e
  if [ "$rc" = 0 ]; then
    [ -f "$final.done" ] && { echo "train.sh: $OUT complete"; exit 0; }
    die "the trainer exited 0 but $final.done is missing"
  fi
  if tail -n +"$((lines0 + 1))" "$OUT/console.txt" | grep -q "(diverged)"; then
    die "$OUT diverged (see $OUT/console.txt): not restarted; resume from the last good checkpoint with a lower --lr"
  fi
  restarts=$((restarts + 1))
  [ "$restarts" -le "$MAX_RESTARTS" ] || die "$OUT failed $restarts times; giving up"
  echo "train.sh: $OUT failed (restart $restarts of $MAX_RESTARTS in 30 s)" >&2
  sleep 30
done
