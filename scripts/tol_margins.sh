#!/usr/bin/env bash
# Measures the margins of the numeric test tolerances (doc/testing.md): runs the given Catch2
# test binaries under every OpenBLAS core type this machine can run and each thread count, with
# $LDM_TOL_REPORT set so every CHECK_TOL (test/helpers.h) and scripts/torch_ref.py comparison
# logs "label  error  bound", then prints per check the worst error / bound over all runs and
# the run it came from, worst first, as a Markdown table; and which runs failed.
#
#   scripts/tol_margins.sh [-c "CORES"] [-t "THREADS"] [-k DIR] BINARY [BINARY...]
#     -c  core types (default: "native Prescott Core2 Nehalem Sandybridge Haswell Zen SkylakeX
#         Cooperlake"; "native" = OpenBLAS's own choice; the others are skipped, with the
#         reason, where scripts/blas_cores.sh says this CPU cannot run them)
#     -t  OpenMP thread counts (default "1 2"); OpenBLAS itself always runs single-threaded
#         inside cpu/ops.cpp's gemm (it is split over the OpenMP threads instead)
#     -k  keep the raw logs in DIR (default: a temporary directory, removed at the end)
#   Extra Catch2 arguments for every binary (e.g. a test-case filter) go in TEST_ARGS.
# Example: scripts/tol_margins.sh build/test/test_infer build/test/test_ldm > margins.md
set -u
case "${1:-}" in -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;; esac
cores="native Prescott Core2 Nehalem Sandybridge Haswell Zen SkylakeX Cooperlake"
threads="1 2"
keep=""
while getopts "c:t:k:" o; do
  case $o in
    c) cores=$OPTARG ;;
    t) threads=$OPTARG ;;
    k) keep=$OPTARG ;;
    *) echo "error: unknown option (see --help)" >&2; exit 1 ;;
  esac
done
shift $((OPTIND - 1))
[ $# -gt 0 ] || { echo "error: no test binaries given (see --help)" >&2; exit 1; }
for b in "$@"; do [ -x "$b" ] || { echo "error: $b is not an executable test binary" >&2; exit 1; }; done
. "$(dirname "$0")/blas_cores.sh"
bins=()
for b in "$@"; do bins+=("$(cd "$(dirname "$b")" && pwd)/$(basename "$b")"); done
cd "$(dirname "$0")/.."
if [ -n "$keep" ]; then mkdir -p "$keep" && logs=$(cd "$keep" && pwd); else logs=$(mktemp -d); fi
[ -n "$keep" ] || trap 'rm -rf "$logs"' EXIT

native=$(blas_native_core "${bins[0]}")
runs=0; failed_runs=()
for core in $cores; do
  if [ "$core" != native ]; then
    why=$(blas_core_usable "$core" "${bins[0]}") || { echo "skipped: OPENBLAS_CORETYPE=$core: $why" >&2; continue; }
  fi
  for nt in $threads; do
    if [ "$core" = native ]; then tag="native ($native) t$nt"; else tag="$core t$nt"; fi
    for b in "${bins[@]}"; do
      log="$logs/$(basename "$b").$core.t$nt"
      echo "run: $tag $(basename "$b")" >&2
      if [ "$core" = native ]; then
        env -u OPENBLAS_CORETYPE LDM_TOL_REPORT="$log.tsv" OMP_NUM_THREADS=$nt OPENBLAS_NUM_THREADS=1 \
          "$b" ${TEST_ARGS:-} > "$log.out" 2>&1
      else
        OPENBLAS_CORETYPE=$core LDM_TOL_REPORT="$log.tsv" OMP_NUM_THREADS=$nt OPENBLAS_NUM_THREADS=1 \
          "$b" ${TEST_ARGS:-} > "$log.out" 2>&1
      fi
      rc=$?
      runs=$((runs + 1))
      line=$(grep '^LDM_TEST_TOTALS' "$log.out" | tail -1)
      read -r _ p f <<< "${line:-x 0 1}"
      if [ "$rc" != 0 ] || [ "$f" != 0 ]; then failed_runs+=("$tag $(basename "$b") (exit $rc, $f failed test cases)"); fi
      [ -f "$log.tsv" ] && awk -F'\t' -v tag="$tag" '{ print $1 "\t" $2 "\t" $3 "\t" tag }' "$log.tsv" >> "$logs/all.tsv"
    done
  done
done

echo "| check (binary/label) | worst error | its bound | error / bound | run (core, threads) | records |"
echo "|---|---|---|---|---|---|"
[ -f "$logs/all.tsv" ] && awk -F'\t' '
  { r = ($3 > 0) ? $2 / $3 : ($2 > 0 ? 1e300 : 0)
    n[$1]++
    if (!($1 in best) || r > best[$1]) { best[$1] = r; err[$1] = $2; bnd[$1] = $3; run[$1] = $4 } }
  END { for (k in best) printf "%s\t%.3g\t%.3g\t%.3g\t%s\t%d\n", k, err[k], bnd[k], best[k], run[k], n[k] }' \
  "$logs/all.tsv" | sort -t$'\t' -k4,4gr | awk -F'\t' '{ printf "| %s | %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5, $6 }'
echo
echo "$runs runs (native = $native); failed: ${#failed_runs[@]}"
for f in "${failed_runs[@]+"${failed_runs[@]}"}"; do echo "  FAILED: $f"; done
[ ${#failed_runs[@]} = 0 ]
