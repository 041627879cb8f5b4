#!/usr/bin/env bash
# scripts/paper/common.sh — shared by the paper-recipe run scripts (sourced, not run). See
# doc/distributed.md "The paper's recipe".
#
# Provides:
#   recipe_for SIZE        sets PRESET, STEPS, MODEL_ARGS for 400m | 1.5b (spec model.md "The paper's
#                          recipe": 2^20 tokens per step = 512 sequences of T = 2048)
#   launcher_cmd NP        prints the launcher prefix for NP = nodes * gpus-per-node processes
#   latest_marker DIR      prints the newest complete checkpoint (ckpt_<step> of the newest
#                          ckpt_<step>.done marker), or nothing
#   run_or_print CMD...    runs CMD (or prints it with --dry-run)
# Globals read: NODES, GPUS_PER_NODE, LAUNCHER (mpirun|srun), HOSTFILE, DRY_RUN, NCCL_ID_FILE.

SEQ_LEN=2048
SEQS_PER_STEP=512                     # 512 * 2048 = 1,048,576 = 2^20 tokens per optimizer step
TOKENS_PER_STEP=$((SEQ_LEN * SEQS_PER_STEP))

die() { echo "error: $*" >&2; exit 1; }

recipe_for() {
  case "$1" in
    400m) PRESET=llama-400m; STEPS=47684; MICRO_B=16 ;;   # 50B tokens (paper: 47,684 steps)
    1.5b) PRESET=qwen-1.5b;  STEPS=94972; MICRO_B=8  ;;   # 100B tokens (paper: 94,972 steps)
    *) die "--size must be 400m or 1.5b, got '$1'" ;;
  esac
  WARMUP=$((STEPS / 100))             # 1% linear warmup, then cosine to 0.1 x peak (our choice)
}

# Micro-batch per GPU: at most MICRO_B sequences, and the 512 sequences of a step must split
# evenly into world x B x accumulation.
micro_batch_for() {
  local world=$1 b=$MICRO_B
  [ $((SEQS_PER_STEP % world)) -eq 0 ] || die "$world GPUs do not divide the $SEQS_PER_STEP sequences of a step (use 1, 2, 4, 8, ... nodes)"
  while [ $((SEQS_PER_STEP / world % b)) -ne 0 ]; do b=$((b / 2)); done
  echo "$b"
}

launcher_cmd() {
  local np=$1
  case "$LAUNCHER" in
    mpirun)
      local hf=""
      [ -n "${HOSTFILE:-}" ] && hf="--hostfile $HOSTFILE "
      echo "mpirun -np $np --npernode $GPUS_PER_NODE ${hf}--bind-to none -x PATH -x LD_LIBRARY_PATH -x NCCL_DEBUG=WARN" ;;
    srun)
      echo "srun --nodes $NODES --ntasks $np --ntasks-per-node $GPUS_PER_NODE --gpus-per-node $GPUS_PER_NODE --cpus-per-task 8 --mpi=pmix" ;;
    *) die "--launcher must be mpirun or srun, got '$LAUNCHER'" ;;
  esac
}

latest_marker() {
  local dir=$1 m
  m=$(ls "$dir"/ckpt_*.done 2>/dev/null | sort | tail -n 1)
  [ -n "$m" ] && echo "${m%.done}"
  return 0
}

# The words of a command, shell-quoted (printf %q) where needed, on one line.
quote_words() { local w o=""; for w in "$@"; do o+="$(printf '%q' "$w") "; done; echo "${o% }"; }

# Runs the command given as words (no eval: paths with spaces stay one word); with DRY_RUN=1
# only prints it.
run_or_print() {
  if [ "${DRY_RUN:-0}" = 1 ]; then quote_words "$@"; else echo "+ $(quote_words "$@")" >&2; "$@"; fi
}
