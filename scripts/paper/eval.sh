#!/usr/bin/env bash
# Evaluates the newest complete checkpoint (newest ckpt_<step>.done marker) of every run
# directory under a sweep directory with scripts/eval_checkpoints.sh (issue #6): the paper's
# table (val ppl, WikiText-2, LAMBADA, HellaSwag) as OUT.md / OUT.csv.
#
#   scripts/paper/eval.sh --runs runs/paper --out results/paper [--eval-dir DIR] [--val-data GLOB]
#       [--final-only] [--dry-run] [-- more eval_checkpoints.sh flags]
#
#   --final-only  only runs that reached their last step (otherwise the newest checkpoint of each)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/common.sh"
root="$(cd "$here/../.." && pwd)"
RUNS="" OUT="" EVDIR="" VAL="" FINAL=0 DRY_RUN=0 EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) RUNS="${2:?}"; shift 2 ;;
    --out) OUT="${2:?}"; shift 2 ;;
    --eval-dir) EVDIR="${2:?}"; shift 2 ;;
    --val-data) VAL="${2:?}"; shift 2 ;;
    --final-only) FINAL=1; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --) shift; EXTRA=("$@"); break ;;
    *) die "unknown flag $1" ;;
  esac
done
[ -n "$RUNS" ] || die "--runs DIR is required"
[ -n "$OUT" ] || die "--out PREFIX is required"
ckpts=()
for d in "$RUNS"/*/; do
  m=$(latest_marker "${d%/}")
  [ -n "$m" ] || continue
  if [ "$FINAL" = 1 ]; then
    step=$(basename "$m"); step=$((10#${step#ckpt_}))
    [ "$step" = 47684 ] || [ "$step" = 94972 ] || continue
  fi
  ckpts+=("$m.model")
done
[ ${#ckpts[@]} -gt 0 ] || die "no complete checkpoint (ckpt_*.done) under $RUNS"
args=(--out "$OUT")
[ -n "$EVDIR" ] && args+=(--eval-dir "$EVDIR")
[ -n "$VAL" ] && args+=(--val-data "$VAL")
run_or_print "$root/scripts/eval_checkpoints.sh" "${args[@]}" ${EXTRA[@]+"${EXTRA[@]}"} "${ckpts[@]}"
