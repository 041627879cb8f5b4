#!/usr/bin/env bash
# Runs each Catch2 test binary given on the command line (from the repository root), shows its
# output, and adds up the test cases. Ends with the suite's closing line
#   tests: N passed, N failed
# and exits non-zero when any test failed or any binary crashed.
# Extra Catch2 arguments can be passed through TEST_ARGS (e.g. TEST_ARGS='-s').
set -u
case "${1:-}" in -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;; esac
cd "$(dirname "$0")/.."
passed=0; failed=0; crashed=(); gpu_skipped=()
start=$(date +%s)
for t in "$@"; do
  echo "=== $t"
  t0=$(date +%s)
  out=$("$t" ${TEST_ARGS:-} 2>&1); rc=$?
  echo "$out" | grep -v '^LDM_TEST_TOTALS'
  line=$(echo "$out" | grep '^LDM_TEST_TOTALS' | tail -1)
  if [ -z "$line" ]; then
    crashed+=("$t (exit $rc)"); failed=$((failed + 1))
  else
    read -r _ p f <<< "$line"
    passed=$((passed + p)); failed=$((failed + f))
    if [ "$rc" != 0 ] && [ "$f" = 0 ]; then crashed+=("$t (exit $rc)"); failed=$((failed + 1)); fi
  fi
  # A test binary that needs a GPU passes without one after printing "skipped: no GPU": list it.
  if echo "$out" | grep -q 'skipped: no GPU'; then gpu_skipped+=("$(basename "$t")"); fi
  echo "=== $t: $(( $(date +%s) - t0 )) s"
done
for c in "${crashed[@]+"${crashed[@]}"}"; do echo "CRASHED or failed without a report: $c"; done
if [ ${#gpu_skipped[@]} -gt 0 ]; then
  echo "skipped (no GPU): the GPU cases of ${gpu_skipped[*]} passed without running"
fi
# Passing test cases delete their scratch files (test/helpers.h); report what is left and the disk.
tmp_left=$(du -sm build/test_tmp 2>/dev/null | cut -f1)
echo "scratch left in build/test_tmp: ${tmp_left:-0} MiB; disk free: $(df -Pm . | awk 'NR == 2 { print $4 }') MiB"
echo "suite time: $(( $(date +%s) - start )) s"
echo "tests: $passed passed, $failed failed"
[ "$failed" = 0 ]
