#!/usr/bin/env bash
# Every run of the paper's recipe (spec model.md "The paper's recipe"), one after the other, each
# through scripts/paper/train.sh (auto-resume; finished runs are skipped):
#   * 400M (llama-400m) and 1.5B (qwen-1.5b), every scheme, 3-point peak-LR sweep
#     {5e-4, 1e-3, 2e-3} ({1e-3, 2e-3, 4e-3} for AttnRes-Block); LDM at 400M with d_k = 4
#   * aspect-ratio sweep at 400M-class size: 42 blocks (d = 768, 381M) and 70 blocks (d = 640,
#     416M) next to the 24-block preset (d = 1024, 411M), for every scheme at its selected LR
#     (LDM 1e-3, mHC 2e-3, AttnRes-Block 2e-3; 1e-3 for the others)
#
#   scripts/paper/sweep.sh --out runs/paper [--sizes "400m 1.5b"] [--schemes "..."]
#       [--part lr|aspect|all] [--list] [train.sh flags: --nodes N --launcher srun --dry-run ...]
#
#   --list     print one line per run (name size scheme lr extra flags) and exit
#   --dry-run  print every run's command (train.sh --dry-run), run nothing
# The LR part with evaluation, summary and verdict on top: scripts/study.sh --recipe paper-400m
# (or paper-1.5b), the same runs through the general study tool (doc/distributed.md).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/common.sh"

OUT="" SIZES="400m 1.5b" SCHEMES="preln hc mhc attnres-full attnres-block ldm" PART=all LIST=0 PASS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT="${2:?}"; shift 2 ;;
    --sizes) SIZES="${2:?}"; shift 2 ;;
    --schemes) SCHEMES="${2:?}"; shift 2 ;;
    --part) PART="${2:?}"; shift 2 ;;
    --list) LIST=1; shift ;;
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) PASS+=("$1"); shift ;;
  esac
done
[ -n "$OUT" ] || die "--out DIR is required"
case "$PART" in lr|aspect|all) ;; *) die "--part must be lr, aspect or all" ;; esac

lrs_for() { if [ "$1" = attnres-block ]; then echo "1e-3 2e-3 4e-3"; else echo "5e-4 1e-3 2e-3"; fi; }
selected_lr() { case "$1" in mhc|attnres-block) echo 2e-3 ;; *) echo 1e-3 ;; esac; }

runs=()   # "name|flags"
if [ "$PART" != aspect ]; then
  for size in $SIZES; do
    for s in $SCHEMES; do
      dk=""
      [ "$s" = ldm ] && [ "$size" = 400m ] && dk="--ldm-dk 4"
      for lr in $(lrs_for "$s"); do
        runs+=("${size}_${s}_lr${lr}|--size $size --scheme $s --lr $lr $dk")
      done
    done
  done
fi
if [ "$PART" != lr ] && [[ " $SIZES " == *" 400m "* ]]; then   # the aspect sweep is at 400M
  for s in $SCHEMES; do
    dk=""
    [ "$s" = ldm ] && dk="--ldm-dk 4"
    for shape in "42 768" "70 640"; do
      set -- $shape
      runs+=("400m_L$1_d$2_${s}_lr$(selected_lr "$s")|--size 400m --n-layer $1 --d-model $2 --scheme $s --lr $(selected_lr "$s") $dk")
    done
  done
fi

if [ "$LIST" = 1 ]; then
  for r in "${runs[@]}"; do echo "${r%%|*} ${r#*|}"; done
  echo "# ${#runs[@]} runs"
  exit 0
fi
[ ${#runs[@]} -gt 0 ] || die "no runs: --part $PART with --sizes '$SIZES' (the aspect sweep is at 400m)"
failed=()
for r in "${runs[@]}"; do
  name="${r%%|*}"
  # shellcheck disable=SC2086
  if ! "$here/train.sh" ${r#*|} --out "$OUT/$name" ${PASS[@]+"${PASS[@]}"}; then
    failed+=("$name")   # e.g. a diverged high-LR point: the sweep goes on
    echo "sweep.sh: $name failed; going on with the next run" >&2
  fi
done
[ ${#failed[@]} -eq 0 ] || die "${#failed[@]} of ${#runs[@]} runs failed: ${failed[*]}"
