#!/usr/bin/env bash
# A comparison of depth-aggregation schemes at any scale, on any trainer: schemes x seeds x LR
# points, every run with the same data, data order (per seed), steps and schedule. Resumable: a
# killed (or --stop-after) study continues where it stopped when run again with the same flags.
# Results in one folder (doc/training.md "Studies"):
#   OUT/summary.md, OUT/summary.csv   per run and per (scheme, LR) over the seeds: final val loss
#                                     (mean, min-max), WikiText-2 word ppl and bits/byte, LAMBADA
#                                     ppl/acc, tokens/s, peak memory; the verdict computed from them
#   OUT/losses.png, OUT/plots/<run>.png   loss curves overlaid, and per run
#   OUT/runs/<scheme>_lr<LR>_s<seed>/    log.jsonl, console.txt, checkpoints, eval.json, sample.txt
#
#   scripts/study.sh --out DIR [--recipe NAME] [options] [-- more trainer flags]
#
# Recipes (defaults that the options after them change; doc/training.md "Studies"):
#   demo        byte-level tiny Shakespeare, `small` at d=128 (4 layers), B=16 T=128, 600 steps,
#               lr 3e-3: preln and ldm, seeds 1 2, CPU (what `make demo` runs)
#   ci          the same on `tiny`, T=32, 8 steps, seeds 1 2 (the test of this script)
#   cpu-fineweb `small` on the FineWeb-Edu sample, GPT-2 vocabulary, B=8 T=128, 200 steps, CPU
#   h200-1h     one GPU (H200): a 124M model (12 x d=640, GPT-2 vocabulary), T=1024, 2^19 tokens
#               per step, 200 steps = 105M tokens per scheme; preln ldm mhc attnres-block; bf16
#   paper-400m, paper-1.5b   the paper's recipe (scripts/paper/common.sh: 2^20 tokens per step,
#               47,684 / 94,972 steps), every scheme, its 3-point LR sweep, on --nodes x 8 GPUs
#
# Options:
#   --out DIR              results folder (required)
#   --trainer cpu|gpu      cpu: BIN/train_cpu; gpu: BIN/train_gpt_baselines and BIN/train_ldm
#   --bin DIR              trainer directory (default $BUILD, else build/; build/cuda for gpu);
#                          the CPU tools (ldm_data, eval_cpu, generate_cpu) come from $BUILD or build/
#   --schemes "A B ..."    preln hc mhc attnres-full attnres-block attnres-block<N> ldm (= ldm-rls)
#                          ldm-delta ldm-outer ldm-rls-nores; the first is the verdict's baseline
#   --seeds "1 2 3"        --lrs "1e-3 3e-3" (LR sweep points; default: the recipe's)
#   --model "FLAGS"        model flags (e.g. "--preset small --d-model 128")
#   -B N, -T N, --total-batch-tokens N, --steps N, --tokens N (steps = N / tokens per step),
#   --warmup-steps N, --schedule S, --min-lr-ratio R, --dtype D, --zero 0|1, --threads N
#                          (without --warmup-steps, a recipe's warm-up scales with --steps / --tokens)
#   --data shakespeare|fineweb-sample|DIR   shakespeare: bytes shards of tiny Shakespeare;
#                          fineweb-sample: GPT-2 shards of the FineWeb-Edu sample; DIR: its
#                          *train*.bin / *val*.bin. Sources: $LDM_DATA_DIR, else ../shared/data
#   --train-data GLOB --val-data GLOB --tokenizer T   instead of --data
#   --val-every N --val-batches N
#   --eval-max-examples N  LAMBADA examples (0 = all); --eval-max-docs N WikiText-2 documents
#   --hellaswag            also HellaSwag; --no-eval: no benchmark evaluation
#   --eval-with eval_cpu|trainer   after training with build/eval_cpu (CPU default) or in the
#                          trainer at the last step (GPU default; one cap for all benchmarks)
#   --sample-prompt TEXT --sample-tokens N   a sample from every final model
#   --ckpt-every N --keep-checkpoints K (default 2)   --drop-final-state (keep only .model)
#   --stop-after K         each unfinished run trains at most K more steps now (time slicing)
#   --np N                 data parallel: mpirun -np N per run; --nodes N --gpus-per-node G
#                          --launcher mpirun|srun --hostfile F: multi-node (scripts/paper)
#   --launch "PREFIX"      any launcher prefix instead (e.g. "mpirun -np 4 --bind-to none")
#   --dry-run              print the runs and their commands, run nothing
# Exit status: 0 when every run finished or was stopped by --stop-after, 1 when a run failed
# (the others still run; the summary marks it), 2 for bad flags, 130 when interrupted (Ctrl-C or
# SIGTERM stops the whole study; the same command resumes it).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=scripts/paper/common.sh
. "$ROOT/scripts/paper/common.sh"   # die, recipe_for, micro_batch_for, launcher_cmd, quote_words
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }

OUT="" RECIPE="" TRAINER=cpu BIN="" SCHEMES="preln ldm" SEEDS="1" LRS="" MODEL="--preset small"
B=8 T=128 TOTAL_BATCH=0 STEPS=200 TOKENS=0 WARMUP="" SCHEDULE=cosine MIN_LR=0.1 DTYPE="" ZERO=""
THREADS="" DATA="" TRAIN="" VAL="" TOK="" VAL_EVERY=0 VAL_BATCHES=20 EVAL=1 EVAL_MAX=200
EVAL_DOCS=3 HELLASWAG=0 EVAL_WITH="" PROMPT="" SAMPLE_TOKENS=0 CKPT_EVERY=0 KEEP=2 DROP_STATE=0
STOP_AFTER=0 NP=1 NODES=1 GPUS_PER_NODE=8 LAUNCHER=mpirun HOSTFILE="" LAUNCH="" DRY_RUN=0 EXTRA=()
PAPER_SIZE="" DEFAULT_LR=3e-3

apply_recipe() {
  case "$1" in
    demo)
      MODEL="--preset small --d-model 128"; DATA=shakespeare; B=16; T=128; STEPS=600; WARMUP=20
      DEFAULT_LR=3e-3; SCHEMES="preln ldm"; SEEDS="1 2"; VAL_EVERY=100; VAL_BATCHES=16
      EVAL_MAX=200; EVAL_DOCS=2; PROMPT="ROMEO:"; SAMPLE_TOKENS=200; DROP_STATE=1 ;;
    ci)
      MODEL="--preset tiny"; DATA=shakespeare; B=4; T=32; STEPS=8; WARMUP=2; DEFAULT_LR=3e-3
      SCHEMES="preln ldm"; SEEDS="1 2"; VAL_EVERY=4; VAL_BATCHES=4; EVAL_MAX=8; EVAL_DOCS=1
      PROMPT="ROMEO:"; SAMPLE_TOKENS=40; THREADS=1; CKPT_EVERY=4 ;;
    cpu-fineweb)
      MODEL="--preset small"; DATA=fineweb-sample; B=8; T=128; STEPS=200; WARMUP=20; DEFAULT_LR=2e-3
      SCHEMES="preln ldm"; SEEDS="1 2 3"; VAL_EVERY=50; VAL_BATCHES=9; EVAL_MAX=200; EVAL_DOCS=3
      PROMPT="The history of"; SAMPLE_TOKENS=48; DROP_STATE=1 ;;
    h200-1h)
      TRAINER=gpu; MODEL="--preset llama-400m --n-layer 12 --d-model 640 --n-head 10 --n-kv-head 10 --head-dim 64 --ffn 1728"
      DATA="${LDM_DATA_DIR:-$ROOT/../shared/data}/fineweb"; B=32; T=1024; TOTAL_BATCH=524288; STEPS=200
      WARMUP=20; DEFAULT_LR=1.5e-3; SCHEMES="preln ldm mhc attnres-block"; SEEDS=1; DTYPE=bf16
      VAL_EVERY=25; VAL_BATCHES=20; EVAL_MAX=0; EVAL_DOCS=0; HELLASWAG=1; PROMPT="The history of"
      SAMPLE_TOKENS=64; CKPT_EVERY=50; KEEP=1 ;;
    paper-400m|paper-1.5b)
      PAPER_SIZE=${1#paper-}; recipe_for "$PAPER_SIZE"   # PRESET STEPS MICRO_B WARMUP
      TRAINER=gpu; MODEL="--preset $PRESET"; T=$SEQ_LEN; TOTAL_BATCH=$TOKENS_PER_STEP; DTYPE=bf16; ZERO=1
      DATA="${LDM_DATA_DIR:-$ROOT/../shared/data}/fineweb"; SCHEMES="preln hc mhc attnres-full attnres-block ldm"
      SEEDS=1337; VAL_EVERY=1000; VAL_BATCHES=20; EVAL_MAX=0; EVAL_DOCS=0; HELLASWAG=1; CKPT_EVERY=1000
      KEEP=2; PROMPT="The history of"; SAMPLE_TOKENS=64 ;;
    *) echo "error: unknown --recipe '$1' (demo ci cpu-fineweb h200-1h paper-400m paper-1.5b)" >&2; exit 2 ;;
  esac
}

# The recipe first, whatever its position; then every other flag overrides it.
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  [ "${args[$i]}" = -- ] && break
  if [ "${args[$i]}" = --recipe ]; then RECIPE="${args[$((i + 1))]:-}"; fi
  case "${args[$i]}" in -h|--help) usage; exit 0 ;; esac
done
[ -n "$RECIPE" ] && apply_recipe "$RECIPE"
RECIPE_STEPS=$STEPS RECIPE_WARMUP=$WARMUP   # a recipe's warm-up scales with --steps / --tokens
need() { [ $# -ge 2 ] || { echo "error: $1 needs a value" >&2; exit 2; }; }
while [ $# -gt 0 ]; do
  case "$1" in
    --recipe) need "$@"; shift 2 ;;
    --out) need "$@"; OUT=$2; shift 2 ;;
    --trainer) need "$@"; TRAINER=$2; shift 2 ;;
    --bin) need "$@"; BIN=$2; shift 2 ;;
    --schemes) need "$@"; SCHEMES=$2; shift 2 ;;
    --seeds) need "$@"; SEEDS=$2; shift 2 ;;
    --lrs|--lr) need "$@"; LRS=$2; shift 2 ;;
    --model) need "$@"; MODEL=$2; shift 2 ;;
    -B) need "$@"; B=$2; shift 2 ;;
    -T) need "$@"; T=$2; shift 2 ;;
    --total-batch-tokens) need "$@"; TOTAL_BATCH=$2; shift 2 ;;
    --steps) need "$@"; STEPS=$2; TOKENS=0; shift 2 ;;
    --tokens) need "$@"; TOKENS=$2; shift 2 ;;
    --warmup-steps) need "$@"; WARMUP=$2; RECIPE_WARMUP=""; shift 2 ;;
    --schedule) need "$@"; SCHEDULE=$2; shift 2 ;;
    --min-lr-ratio) need "$@"; MIN_LR=$2; shift 2 ;;
    --dtype) need "$@"; DTYPE=$2; shift 2 ;;
    --zero) need "$@"; ZERO=$2; shift 2 ;;
    --threads) need "$@"; THREADS=$2; shift 2 ;;
    --data) need "$@"; DATA=$2; shift 2 ;;
    --train-data) need "$@"; TRAIN=$2; shift 2 ;;
    --val-data) need "$@"; VAL=$2; shift 2 ;;
    --tokenizer) need "$@"; TOK=$2; shift 2 ;;
    --val-every) need "$@"; VAL_EVERY=$2; shift 2 ;;
    --val-batches) need "$@"; VAL_BATCHES=$2; shift 2 ;;
    --eval-max-examples) need "$@"; EVAL_MAX=$2; shift 2 ;;
    --eval-max-docs) need "$@"; EVAL_DOCS=$2; shift 2 ;;
    --hellaswag) HELLASWAG=1; shift ;;
    --no-eval) EVAL=0; shift ;;
    --eval-with) need "$@"; EVAL_WITH=$2; shift 2 ;;
    --sample-prompt) need "$@"; PROMPT=$2; shift 2 ;;
    --sample-tokens) need "$@"; SAMPLE_TOKENS=$2; shift 2 ;;
    --ckpt-every) need "$@"; CKPT_EVERY=$2; shift 2 ;;
    --keep-checkpoints) need "$@"; KEEP=$2; shift 2 ;;
    --drop-final-state) DROP_STATE=1; shift ;;
    --stop-after) need "$@"; STOP_AFTER=$2; shift 2 ;;
    --np) need "$@"; NP=$2; shift 2 ;;
    --nodes) need "$@"; NODES=$2; shift 2 ;;
    --gpus-per-node) need "$@"; GPUS_PER_NODE=$2; shift 2 ;;
    --launcher) need "$@"; LAUNCHER=$2; shift 2 ;;
    --hostfile) need "$@"; HOSTFILE=$2; shift 2 ;;
    --launch) need "$@"; LAUNCH=$2; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    --) shift; EXTRA=("$@"); break ;;
    *) echo "error: unknown flag $1 (see --help)" >&2; exit 2 ;;
  esac
done

bad() { echo "error: $*" >&2; exit 2; }
[ -n "$OUT" ] || bad "--out DIR is required"
case "$TRAINER" in cpu|gpu) ;; *) bad "--trainer must be cpu or gpu, got '$TRAINER'" ;; esac
TOOLS="${BUILD:-$ROOT/build}"   # ldm_data, eval_cpu, generate_cpu (CPU tools; `make cpu`)
[ -n "$BIN" ] || { if [ "$TRAINER" = gpu ]; then BIN="$TOOLS/cuda"; else BIN="$TOOLS"; fi; }
[ -n "$EVAL_WITH" ] || { if [ "$TRAINER" = gpu ]; then EVAL_WITH=trainer; else EVAL_WITH=eval_cpu; fi; }
case "$EVAL_WITH" in eval_cpu|trainer) ;; *) bad "--eval-with must be eval_cpu or trainer" ;; esac
for v in B T STEPS TOKENS TOTAL_BATCH VAL_EVERY VAL_BATCHES EVAL_MAX EVAL_DOCS SAMPLE_TOKENS CKPT_EVERY KEEP STOP_AFTER NP NODES GPUS_PER_NODE; do
  [[ "${!v}" =~ ^[0-9]+$ ]] || bad "$v must be a non-negative integer, got '${!v}'"
done
[ "$B" -gt 0 ] && [ "$T" -gt 0 ] || bad "-B and -T must be > 0"
[ -n "$SCHEMES" ] || bad "--schemes is empty"
[ -n "$SEEDS" ] || bad "--seeds is empty"
for s in $SEEDS; do [[ "$s" =~ ^[0-9]+$ ]] || bad "seed '$s' is not a non-negative integer"; done

# Launcher: data parallel over NP processes, or NODES x GPUS_PER_NODE, or a given prefix.
WORLD=1
if [ -n "$LAUNCH" ]; then
  WORLD=0   # unknown: the trainer checks the batch split
elif [ "$NODES" -gt 1 ] || [ -n "$HOSTFILE" ] || { [ -n "$PAPER_SIZE" ] && [ "$GPUS_PER_NODE" -gt 1 ] && [ "$NP" = 1 ]; }; then
  WORLD=$((NODES * GPUS_PER_NODE))
  LAUNCH=$(launcher_cmd "$WORLD")
elif [ "$NP" -gt 1 ]; then
  WORLD=$NP
  LAUNCH="mpirun -np $NP --bind-to none"
  [ "$(id -u)" = 0 ] && LAUNCH="mpirun --allow-run-as-root -np $NP --bind-to none"
  [ "$NP" -gt "$(nproc)" ] && LAUNCH="$LAUNCH --oversubscribe"
fi
if [ -n "$PAPER_SIZE" ] && [ "$WORLD" -gt 0 ]; then B=$(micro_batch_for "$WORLD"); fi

# Steps from a token budget (tokens per step = --total-batch-tokens, else B*T per process).
per_step=$TOTAL_BATCH
[ "$per_step" -gt 0 ] || per_step=$((B * T * (WORLD > 0 ? WORLD : 1)))
if [ "$TOKENS" -gt 0 ]; then
  STEPS=$((TOKENS / per_step))
  [ "$STEPS" -ge 1 ] || bad "--tokens $TOKENS is less than one step of $per_step tokens"
fi
[ "$STEPS" -ge 1 ] || bad "--steps must be >= 1"
if [ -n "$RECIPE_WARMUP" ] && [ "$STEPS" != "$RECIPE_STEPS" ]; then
  WARMUP=$((RECIPE_WARMUP * STEPS / RECIPE_STEPS))   # the recipe's fraction of the new step count
  [ "$RECIPE_WARMUP" -gt 0 ] && [ "$WARMUP" -lt 1 ] && WARMUP=1
fi
[ -n "$WARMUP" ] || WARMUP=$((STEPS / 20))

scheme_flags() {  # name -> trainer flags
  case "$1" in
    preln|hc|mhc|attnres-full|attnres-block) echo "--scheme $1" ;;
    attnres-block[0-9]*) echo "--scheme attnres-block --attnres-blocks ${1#attnres-block}" ;;
    ldm|ldm-rls) echo "--scheme ldm" ;;
    ldm-delta) echo "--scheme ldm --ldm-rule delta" ;;
    ldm-outer) echo "--scheme ldm --ldm-rule outer" ;;
    ldm-rls-nores) echo "--scheme ldm --no-residual" ;;
    *) return 1 ;;
  esac
}
trainer_of() {  # name -> trainer binary
  if [ "$TRAINER" = cpu ]; then echo "$BIN/train_cpu"
  elif [[ "$1" == ldm* ]]; then echo "$BIN/train_ldm"
  else echo "$BIN/train_gpt_baselines"; fi
}
lrs_of() {  # name -> LR sweep points
  if [ -n "$LRS" ]; then echo "$LRS"
  elif [ -n "$PAPER_SIZE" ]; then if [[ "$1" == attnres-block* ]]; then echo "1e-3 2e-3 4e-3"; else echo "5e-4 1e-3 2e-3"; fi
  else echo "$DEFAULT_LR"; fi
}
for s in $SCHEMES; do
  scheme_flags "$s" > /dev/null || bad "unknown scheme '$s' (preln hc mhc attnres-full attnres-block[N] ldm ldm-delta ldm-outer ldm-rls-nores)"
  [ "$DRY_RUN" = 1 ] || [ -x "$(trainer_of "$s")" ] || die "$(trainer_of "$s") not found (make cpu / make cuda, or --bin DIR)"
done

if [ "$DRY_RUN" = 0 ]; then
  for t in ldm_data eval_cpu generate_cpu; do
    [ -x "$TOOLS/$t" ] || die "$TOOLS/$t not found: build the CPU tools first (make cpu)"
  done
fi

# Data: a named source, a shard directory, or explicit globs.
SRC=""
for d in "${LDM_DATA_DIR:-}" "$ROOT/../shared/data"; do
  if [ -n "$d" ] && [ -d "$d" ]; then SRC=$(cd "$d" && pwd); break; fi
done
OUT=$(realpath -m "$OUT")
[ "$DRY_RUN" = 1 ] || mkdir -p "$OUT"
prepare_data() {
  case "$DATA" in
    "") ;;
    shakespeare)
      local in="$SRC/tinyshakespeare/input.txt"
      [ -f "$in" ] || die "--data shakespeare: $in not found (set LDM_DATA_DIR or run scripts/download_data.sh tinyshakespeare)"
      TOK=${TOK:-bytes}
      [ "$TOK" = bytes ] || die "--data shakespeare is byte-level: drop --tokenizer $TOK or give --train-data"
      if [ ! -f "$OUT/data/ts_val_000000.bin" ] && [ "$DRY_RUN" = 0 ]; then
        # the first 100,000 bytes (742 documents) are the validation shard
        "$TOOLS/ldm_data" shards --tokenizer bytes --format text --text-split blank --input "$in" \
          --out-dir "$OUT/data" --name ts --val-tokens 100000 --shard-tokens 500000 --quiet > /dev/null
      fi
      TRAIN=${TRAIN:-$OUT/data/ts_train_*.bin}; VAL=${VAL:-$OUT/data/ts_val_*.bin} ;;
    fineweb-sample)
      local in="$SRC/fineweb_edu_sample/fineweb_edu_sample.jsonl"
      [ -f "$in" ] || die "--data fineweb-sample: $in not found (set LDM_DATA_DIR or run scripts/download_data.sh)"
      TOK=${TOK:-$SRC/gpt2_tokenizer}
      if [ ! -f "$OUT/data/fineweb_val_000000.bin" ] && [ "$DRY_RUN" = 0 ]; then
        "$TOOLS/ldm_data" shards --tokenizer "$TOK" --input "$in" --out-dir "$OUT/data" --name fineweb \
          --val-docs 15 --quiet > /dev/null
      fi
      TRAIN=${TRAIN:-$OUT/data/fineweb_train_*.bin}; VAL=${VAL:-$OUT/data/fineweb_val_*.bin} ;;
    *)
      [ -d "$DATA" ] || [ "$DRY_RUN" = 1 ] || die "--data $DATA: not a directory of token shards (nor shakespeare / fineweb-sample)"
      TRAIN=${TRAIN:-$DATA/*train*.bin}; VAL=${VAL:-$DATA/*val*.bin} ;;
  esac
  [ -n "$TRAIN" ] || die "no training data: give --data or --train-data"
  if [ -z "$TOK" ] && [ -n "$SRC" ]; then TOK="$SRC/gpt2_tokenizer"; fi
}
prepare_data

# Eval binaries for this tokenizer, built once into OUT/eval from the data sources.
LAMBADA="" WIKITEXT="" HS=""
if [ "$EVAL" = 1 ] && [ -n "$SRC" ]; then
  [ "$DRY_RUN" = 1 ] || mkdir -p "$OUT/eval"
  build_eval() {  # kind input output
    [ -f "$2" ] || { echo "study: $2 not found: no $1 evaluation" >&2; return 1; }
    [ -f "$3" ] || [ "$DRY_RUN" = 1 ] || "$TOOLS/ldm_data" "$1" --tokenizer "$TOK" --input "$2" --out "$3" > /dev/null
  }
  build_eval lambada "$SRC/lambada/lambada_test.jsonl" "$OUT/eval/lambada.bin" && LAMBADA="$OUT/eval/lambada.bin"
  build_eval wikitext "$SRC/wikitext2/wiki.test.raw" "$OUT/eval/wikitext2.bin" && WIKITEXT="$OUT/eval/wikitext2.bin"
  if [ "$HELLASWAG" = 1 ]; then
    # the shared copy is the .bz2 of the full set; scripts/download_data.sh fetches the .jsonl
    HS_SRC="$SRC/hellaswag/hellaswag_val.jsonl"
    [ -f "$HS_SRC" ] || HS_SRC="$SRC/hellaswag/hellaswag_val_full.txt.bz2"
    build_eval hellaswag "$HS_SRC" "$OUT/eval/hellaswag.bin" && HS="$OUT/eval/hellaswag.bin"
  fi
fi
[ "$EVAL" = 1 ] && [ -z "$LAMBADA$WIKITEXT$HS" ] && echo "study: no eval data found: val loss only" >&2

# The plan: seed-major, so an interrupted study has every scheme at the first seeds.
runs=()   # "name|scheme|lr|seed"
for seed in $SEEDS; do
  for s in $SCHEMES; do
    for lr in $(lrs_of "$s"); do runs+=("${s}_lr${lr}_s${seed}|$s|$lr|$seed"); done
  done
done

run_cmd_of() {  # scheme lr seed dir -> the trainer command, one word per line
  local s=$1 lr=$2 seed=$3 dir=$4 w
  local c=()
  # shellcheck disable=SC2206
  [ -n "$LAUNCH" ] && c+=($LAUNCH)
  c+=("$(trainer_of "$s")")
  # shellcheck disable=SC2206
  c+=($MODEL $(scheme_flags "$s"))
  [ -n "$PAPER_SIZE" ] && [ "$PAPER_SIZE" = 400m ] && [[ "$s" == ldm* ]] && c+=(--ldm-dk 4)
  c+=(-B "$B" -T "$T")
  [ "$TOTAL_BATCH" -gt 0 ] && c+=(--total-batch-tokens "$TOTAL_BATCH")
  c+=(--steps "$STEPS" --lr "$lr" --warmup-steps "$WARMUP" --schedule "$SCHEDULE" --min-lr-ratio "$MIN_LR")
  c+=(--seed "$seed" --train-data "$TRAIN")
  [ -n "$VAL" ] && c+=(--val-data "$VAL" --val-every "$VAL_EVERY" --val-batches "$VAL_BATCHES")
  [ -n "$TOK" ] && c+=(--tokenizer "$TOK")
  [ -n "$DTYPE" ] && c+=(--dtype "$DTYPE")
  [ -n "$ZERO" ] && c+=(--zero "$ZERO")
  [ -n "$THREADS" ] && c+=(--threads "$THREADS")
  if [ "$EVAL_WITH" = trainer ]; then
    [ -n "$LAMBADA" ] && c+=(--eval-lambada "$LAMBADA")
    [ -n "$WIKITEXT" ] && c+=(--eval-wikitext "$WIKITEXT")
    [ -n "$HS" ] && c+=(--eval-hellaswag "$HS")
    [ -n "$LAMBADA$WIKITEXT$HS" ] && c+=(--eval-max-examples "$EVAL_MAX")
  fi
  c+=(--sample-every -1 --quiet --ckpt-every "$CKPT_EVERY" --keep-checkpoints "$KEEP" --out-dir "$dir" --log "$dir/log.jsonl")
  [ ${#EXTRA[@]} -gt 0 ] && c+=("${EXTRA[@]}")
  for w in "${c[@]}"; do printf '%s\n' "$w"; done
}

final_of() { printf '%s/ckpt_%06d' "$1" "$STEPS"; }
# Deletes all but the newest K checkpoints of a run directory (the trainer's --keep-checkpoints
# counts only what one invocation wrote; a study resumes many times).
# Only complete checkpoints count (a .done marker or a .state; the final one also without them
# when --drop-final-state dropped its state): one cut short by a kill never displaces the newest
# complete one. Names sort by step (ckpt_%06d).
prune_checkpoints() {  # dir K
  local f b i final complete=()
  final=$(final_of "$1")
  for f in "$1"/ckpt_*.model; do
    [ -e "$f" ] || continue
    b=${f%.model}
    if [ -f "$b.done" ] || [ -f "$b.state" ] || { [ "$DROP_STATE" = 1 ] && [ "$b" = "$final" ]; }; then
      complete+=("$b")
    fi
  done
  for ((i = 0; i < ${#complete[@]} - $2; i++)); do
    b=${complete[$i]}; rm -f "$b.model" "$b.state" "$b".state.rank* "$b.done"
  done
}
final_exists() { [ -f "$1.model" ] && { [ -f "$1.done" ] || [ -f "$1.state" ] || [ "$DROP_STATE" = 1 ]; }; }

lr_desc=""; for s in $SCHEMES; do lr_desc+="${lr_desc:+, }$s $(lrs_of "$s")"; done
echo "study: ${#runs[@]} runs (seeds: $SEEDS; LRs: $lr_desc), $STEPS steps of $per_step tokens, trainer $TRAINER${LAUNCH:+ via '$LAUNCH'} -> $OUT"
if [ "$DRY_RUN" = 1 ]; then
  for r in "${runs[@]}"; do
    IFS='|' read -r name s lr seed <<< "$r"
    mapfile -t c < <(run_cmd_of "$s" "$lr" "$seed" "$OUT/runs/$name")
    echo "# $name"
    sa=""; [ "$STOP_AFTER" -gt 0 ] && sa=" --stop-after $STOP_AFTER"
    echo "$(quote_words "${c[@]}") --resume auto$sa"
  done
  exit 0
fi

failed=0 stopped=0 done_n=0 i=0
t_study=$(date +%s)
# Ctrl-C (SIGINT to the whole foreground group) or SIGTERM stops the study, not only the run in
# progress: the trainer exits 130/143 (its last checkpoint stays), and so does the study.
interrupted=0
trap 'interrupted=1' INT TERM
stop_if_interrupted() {  # $1: what was running
  [ "$interrupted" = 1 ] || return 0
  echo "study: interrupted during $1; run the same command again to resume (finished runs are kept)" >&2
  exit 130
}
for r in "${runs[@]}"; do
  stop_if_interrupted "the study, before its run $((i + 1))"
  i=$((i + 1))
  IFS='|' read -r name s lr seed <<< "$r"
  dir="$OUT/runs/$name"
  mkdir -p "$dir"
  mapfile -t c < <(run_cmd_of "$s" "$lr" "$seed" "$dir")
  ident=$(quote_words "${c[@]}")
  final=$(final_of "$dir")
  # the evaluation and sampling commands: a change to their flags alone (--eval-max, --prompt, ...)
  # redoes them on the finished model; eval_cmd.txt / sample_cmd.txt record what made the files
  e=(); eval_ident=""
  if [ "$EVAL_WITH" = eval_cpu ] && [ -n "$LAMBADA$WIKITEXT$HS" ]; then
    e=(--checkpoint "$final.model" --out "$dir/eval.json" --quiet --max-examples "$EVAL_MAX" --max-docs "$EVAL_DOCS")
    [ -n "$LAMBADA" ] && e+=(--lambada "$LAMBADA")
    [ -n "$WIKITEXT" ] && e+=(--wikitext "$WIKITEXT")
    [ -n "$HS" ] && e+=(--hellaswag "$HS")
    [ -n "$TOK" ] && e+=(--tokenizer "$TOK")
    [ -n "$THREADS" ] && e+=(--threads "$THREADS")
    eval_ident=$(quote_words "$TOOLS/eval_cpu" "${e[@]}")
  fi
  gen=(); sample_ident=""
  if [ "$SAMPLE_TOKENS" -gt 0 ]; then
    g=(--checkpoint "$final.model" --prompt "$PROMPT" --max-new-tokens "$SAMPLE_TOKENS" --top-p 0.9
       --temperature 0.8 --seed "$seed")
    [ -n "$TOK" ] && g+=(--tokenizer "$TOK")
    if [ "$TRAINER" = cpu ]; then
      [ -n "$THREADS" ] && g+=(--threads "$THREADS")
      gen=("$TOOLS/generate_cpu" "${g[@]}")
    else
      gen=("$(trainer_of "$s")" --generate "${g[@]}")
    fi
    sample_ident=$(quote_words "${gen[@]}")
  fi
  eval_current() { [ -z "$eval_ident" ] || { [ -f "$dir/eval.json" ] && [ "$(cat "$dir/eval_cmd.txt" 2>/dev/null)" = "$eval_ident" ]; }; }
  # (a failed sampling counts as done: sample_cmd.txt is written either way)
  sample_current() { [ -z "$sample_ident" ] || [ "$(cat "$dir/sample_cmd.txt" 2>/dev/null)" = "$sample_ident" ]; }
  if [ -f "$dir/done.json" ] && [ "$(cat "$dir/cmd.txt" 2>/dev/null)" = "$ident" ] && eval_current && sample_current; then
    echo "study: [$i/${#runs[@]}] $name: done earlier"
    done_n=$((done_n + 1)); continue
  fi
  rm -f "$dir/done.json" "$dir/failed.txt"
  if [ -f "$dir/cmd.txt" ] && [ "$(cat "$dir/cmd.txt")" != "$ident" ]; then
    # another command (e.g. more --steps): the evaluation and sample of the old model are stale
    rm -f "$dir/eval.json" "$dir/eval_console.txt" "$dir/eval_cmd.txt" "$dir/sample.txt" "$dir/sample_console.txt" \
      "$dir/sample_stderr.txt" "$dir/sample_cmd.txt"
    if [ "$DROP_STATE" = 1 ] && ! final_exists "$(final_of "$dir")" && compgen -G "$dir/ckpt_*.model" > /dev/null &&
       ! compgen -G "$dir/ckpt_*.state" > /dev/null && ! compgen -G "$dir/ckpt_*.done" > /dev/null; then
      echo "study: [$i/${#runs[@]}] $name: the command changed and this recipe dropped the optimizer state of" \
        "the finished checkpoint (--drop-final-state): the run trains again from step 0" >&2
    fi
  fi
  printf '%s\n' "$ident" > "$dir/cmd.txt"
  [ "$KEEP" -gt 0 ] && prune_checkpoints "$dir" "$KEEP"
  if ! final_exists "$final"; then
    extra=(--resume auto)
    [ "$STOP_AFTER" -gt 0 ] && extra+=(--stop-after "$STOP_AFTER")
    gpu=(); [ "$TRAINER" = gpu ] && gpu=(--gpu)
    echo "study: [$i/${#runs[@]}] $name: training (console: $dir/console.txt)"
    t0=$(date +%s)
    lines0=0   # console.txt holds every attempt; this one's lines start after lines0
    [ -f "$dir/console.txt" ] && lines0=$(wc -l < "$dir/console.txt")
    set +e
    # the console goes to console.txt; every 100th step line (with its ETA) is shown here too
    /usr/bin/python3 "$ROOT/scripts/measure_run.py" --record "$dir/invocations.jsonl" "${gpu[@]}" -- \
      "${c[@]}" "${extra[@]}" 2>&1 | tee -a "$dir/console.txt" | \
      grep --line-buffered -E '^step +[0-9]*00/[0-9]+ \|' | sed -u -E "s/ \| lr .* ms \|/ |/; s|^|study:   $name: |"
    rc=${PIPESTATUS[0]}
    set -e
    case $rc in 130|143) interrupted=1 ;; esac
    stop_if_interrupted "$name (training)"
    if [ "$rc" != 0 ]; then
      msg=$(tail -n +"$((lines0 + 1))" "$dir/console.txt" | grep -a "error" | tail -n 1 || true)
      echo "${msg:-exit status $rc}" > "$dir/failed.txt"
      echo "study: [$i/${#runs[@]}] $name: FAILED (exit $rc): ${msg:-see $dir/console.txt}" >&2
      failed=$((failed + 1)); continue
    fi
    tail -n +"$((lines0 + 1))" "$dir/console.txt" | grep -a "final val loss\|stopped after" | tail -n 1 |
      sed "s|^|study:   $name: |" || true
    echo "study:   $name: $(( $(date +%s) - t0 )) s"
    if ! final_exists "$final"; then
      stopped=$((stopped + 1)); continue   # --stop-after: continues on the next invocation
    fi
  fi
  # evaluation with eval_cpu (the trainer's own evaluation is in log.jsonl)
  if ! eval_current; then
    rm -f "$dir/eval.json" "$dir/eval_cmd.txt"
    if ! "$TOOLS/eval_cpu" "${e[@]}" > "$dir/eval_console.txt" 2>&1; then
      stop_if_interrupted "$name (evaluation)"
      echo "eval_cpu failed: $(grep -a error "$dir/eval_console.txt" | tail -n 1)" > "$dir/failed.txt"
      echo "study: [$i/${#runs[@]}] $name: evaluation FAILED ($dir/eval_console.txt)" >&2
      failed=$((failed + 1)); continue
    fi
    printf '%s\n' "$eval_ident" > "$dir/eval_cmd.txt"
  fi
  # a sample from the final model
  if ! sample_current; then
    rm -f "$dir/sample.txt" "$dir/sample_cmd.txt"
    if "${gen[@]}" > "$dir/sample_console.txt" 2> "$dir/sample_stderr.txt"; then
      # the text: from the line that starts with the prompt to the "---" line that ends it
      awk -v p="${PROMPT%%$'\n'*}" 'on && /^---$/ { exit } !on && index($0, p) == 1 { on = 1 } on { print }' \
        "$dir/sample_console.txt" > "$dir/sample.txt.tmp" && mv "$dir/sample.txt.tmp" "$dir/sample.txt"
    else
      stop_if_interrupted "$name (sampling)"
      echo "study:   $name: sampling failed ($dir/sample_console.txt); the run counts as done" >&2
    fi
    printf '%s\n' "$sample_ident" > "$dir/sample_cmd.txt"
  fi
  prune_checkpoints "$dir" 1   # a finished run keeps its final checkpoint only
  [ "$DROP_STATE" = 1 ] && rm -f "$final.state" "$final".state.rank* "$final.done"
  printf '{"run": "%s", "scheme": "%s", "lr": "%s", "seed": %s, "steps": %s, "finished": %s}\n' \
    "$name" "$s" "$lr" "$seed" "$STEPS" "$(date +%s)" > "$dir/done.json.tmp" && mv "$dir/done.json.tmp" "$dir/done.json"
  done_n=$((done_n + 1))
done

stop_if_interrupted "the study, after its last run"
names=(); for r in "${runs[@]}"; do names+=("${r%%|*}"); done
/usr/bin/python3 "$ROOT/scripts/study_summary.py" --out "$OUT" --baseline "${SCHEMES%% *}" \
  --steps "$STEPS" --tokens-per-step "$per_step" --runs "${names[@]}" || { echo "study: summary failed" >&2; failed=$((failed + 1)); }
hint=""; [ "$stopped" -gt 0 ] && hint=" (--stop-after: run the same command again to continue)"
echo "study: $done_n of ${#runs[@]} runs done, $stopped stopped early$hint, $failed failed; $(( $(date +%s) - t_study )) s; $OUT/summary.md"
[ "$failed" = 0 ]
