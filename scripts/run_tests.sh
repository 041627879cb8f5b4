#!/usr/bin/env bash
# Runs each Catch2 test binary given on the command line (from the repository root), shows its
# output, and adds up the test cases. Ends with the suite's closing line
#   tests: N passed, N failed
# (after the first lines of each failed check, the last lines of each crashed binary and a list of
# the failed test cases and crashed binaries, so that the end of a log, all a CI page may show,
# names them and says why)
# and exits non-zero when any test failed or any binary crashed.
# Extra Catch2 arguments can be passed through TEST_ARGS (e.g. TEST_ARGS='-s'). A binary that runs
# longer than LDM_TEST_TIMEOUT seconds (default 1200: four times the slowest binary on 2 cores) is
# stopped and counted as failed, so that a hang cannot use up a CI job's time (timeout --foreground:
# the binary stays in the terminal's process group, so Ctrl-C still stops it with the suite; a
# pooled one, below, through the runner's trap).
# The ThreadSanitizer binaries (build/tsan/*) and the emulation tests (build/test/test_emu_*), one
# OS thread each, run LDM_TEST_JOBS at a time (default: the number of cores, at most 8), as do the
# one-thread BLAS variants below (beside the two-thread ones); the other binaries run one at a
# time; every output is shown in order. A pool runs in a process group of its own: Ctrl-C or a
# TERM to the runner stops it, and it starts nothing more once the runner is gone.
# The test cases tagged [blas] (numeric checks whose results depend on the BLAS kernel and the
# thread count; doc/testing.md) then run again for each CORE:THREADS of $LDM_BLAS_VARIANTS
# (OPENBLAS_CORETYPE=CORE, "native" = OpenBLAS's own choice, OMP_NUM_THREADS=THREADS; default
# "native:1 Haswell:1 Haswell:2 SkylakeX:1 Sandybridge:2", "" for none) and count in the
# closing line. A core type this CPU or this OpenBLAS cannot run is skipped and listed as
# skipped (scripts/blas_cores.sh), not failed. Checks a test case skips with a visible warning
# (no GPU, no data, no mpirun, no nvcc) pass, and are listed before the closing line.
set -u
case "${1:-}" in -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;; esac
cd "$(dirname "$0")/.."
passed=0; failed=0; crashed=(); gpu_skipped=(); other_skipped=(); failed_cases=(); details=()
limit=${LDM_TEST_TIMEOUT:-1200}
# Catch2's block of each failed check in output $1: "file:line: FAILED:", then the expression and
# its expansion (4 lines at most, of at most 200 characters; the messages follow in the output),
# 15 lines at most in all
catch2_failures() {
  echo "$1" | awk '/: FAILED:$/ { n = 4; print "  " substr($0, 1, 200); next }
    n > 0 { if ($0 == "" || /^(-----|=====|with message)/) { n = 0; next } print "  " substr($0, 1, 200); n-- }' |
    head -n 15
}
# The last lines of output $1 (a crashed or timed-out binary's), or "(no output)"
last_lines() {
  local l
  l=$(echo "$1" | grep -v -E '^LDM_TEST_(TOTALS|FAILED)' | grep -v '^$' | tail -n 5 | cut -c 1-200 | sed 's/^/  /')
  echo "${l:-  (no output)}"
}
# timed_run PREFIX CMD...: runs CMD under the timeout (stdin from /dev/null), its output in
# PREFIX.out, then "EXIT_STATUS TIMED_OUT SECONDS" in PREFIX.rc (written last, by a rename).
timed_run() {
  local prefix=$1 t0 rc timed
  shift
  t0=$(date +%s)
  timeout --foreground -k 30 "$limit" "$@" < /dev/null > "$prefix.out" 2>&1; rc=$?
  # 124: stopped by the timeout; 137 after its -k KILL (or an out-of-memory kill: then it was shorter)
  timed=0
  case $rc in 124) timed=1 ;; 137) [ $(( $(date +%s) - t0 )) -ge "$limit" ] && timed=1 ;; esac
  echo "$rc $timed $(( $(date +%s) - t0 ))" > "$prefix.rc.tmp" && mv -f "$prefix.rc.tmp" "$prefix.rc"
}
# run_binary T PREFIX: test binary T with $TEST_ARGS, as timed_run.
run_binary() {
  local run=("$1")
  # ThreadSanitizer builds ($BUILD/tsan): without address-space randomisation, which the GCC 12
  # runtime cannot map its shadow around on kernels with vm.mmap_rnd_bits > 28.
  case "$1" in */tsan/*) setarch "$(uname -m)" -R true 2>/dev/null && run=(setarch "$(uname -m)" -R "$1") ;; esac
  timed_run "$2" "${run[@]}" ${TEST_ARGS:-}
}
# run_blas T PREFIX CORE:THREADS: T's [blas] test cases under OpenBLAS core type CORE ("native":
# OpenBLAS's own choice) and OMP_NUM_THREADS=THREADS, as timed_run.
run_blas() {
  local core=${3%%:*} nt=${3#*:}
  local envs=(env -u OPENBLAS_CORETYPE OMP_NUM_THREADS="$nt")
  [ "$core" = native ] || envs=(env OPENBLAS_CORETYPE="$core" OMP_NUM_THREADS="$nt")
  timed_run "$2" "${envs[@]}" "$1" "[blas]"
}
# The ThreadSanitizer builds and the emulation tests run one OS thread each, mostly (the emulated
# threads are fibers of it; test_emu_train's trainers and test_emu_nccl's two ranks are short) and
# wait on no clock: LDM_TEST_JOBS of them (default: the number of cores, at most 8) run at once, each run of
# consecutive ones as a pool (`make test` lists them last, the longest first); their outputs are
# shown in order as they finish. Every other binary runs alone (many use every core, or time what
# they wait for).
jobs=${LDM_TEST_JOBS:-$(n=$(nproc 2>/dev/null || echo 1); echo $(( n > 8 ? 8 : n )))}
case "$jobs" in ''|*[!0-9]*|0) echo "run_tests.sh: LDM_TEST_JOBS must be a positive integer, not '$jobs'" >&2; exit 2 ;; esac
parallel() { case "$1" in */tsan/*|*/test/test_emu_*) return 0 ;; esac; return 1; }
# (each binary's output and status until it is reported)
scratch=$(mktemp -d "${TMPDIR:-/tmp}/run_tests.XXXXXX") ||
  { echo "run_tests.sh: cannot make a scratch directory in ${TMPDIR:-/tmp} (set TMPDIR to a writable one)" >&2; exit 2; }
# A pool runs in a process group of its own (set -m), so that leaving early (Ctrl-C, a TERM, an
# error) stops it with every binary it started.
pools=()
trap 'for p in "${pools[@]+"${pools[@]}"}"; do kill -- "-$p" 2>/dev/null; done; rm -rf "$scratch"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
# start_pool JOB K...: runs `JOB K` for each K in the background, LDM_TEST_JOBS at a time, as a
# pool ($pool, added to pools) that starts nothing more once the runner or its scratch is gone.
start_pool() {
  local job=$1
  shift
  set -m
  ( for k in "$@"; do
      while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n; done
      [ -d "$scratch" ] && kill -0 $$ 2>/dev/null || exit 1  # (the runner is gone)
      "$job" "$k" &
    done
    wait ) &
  pool=$!
  set +m
  pools+=("$pool")
}
# await PREFIX: waits until the pooled run PREFIX has its status, or its pool has ended.
await() { while [ ! -e "$1.rc" ] && kill -0 "$pool" 2>/dev/null; do sleep 1; done; }
# read_result PREFIX WHAT: sets out, rc, timed, secs from the run PREFIX and removes its files; a
# run without a status (its pool stopped, a full disk) reads as failed, with a line naming WHAT.
read_result() {
  rc=1; timed=0; secs=0
  out=$(cat "$1.out" 2>/dev/null)
  if [ -e "$1.rc" ]; then read -r rc timed secs < "$1.rc"; else out="$out
NOT RUN OR NOT FINISHED: $2 (its pool stopped, or its status could not be written in $scratch)"; fi
  rm -f "$1.out" "$1.rc"
}
# count_result WHAT: adds the totals of $out (status $rc, $timed) to the suite's (totals: its
# LDM_TEST_TOTALS line, p and f: its counts); its failed test cases and checks, or a crash (no
# totals, or a non-zero status without a failed case), are recorded under WHAT.
count_result() {
  local fails why c
  totals=$(echo "$out" | grep '^LDM_TEST_TOTALS' | tail -1)
  while IFS= read -r c; do failed_cases+=("$1: ${c#LDM_TEST_FAILED }"); done < <(echo "$out" | grep '^LDM_TEST_FAILED ')
  fails=$(catch2_failures "$out")
  [ -n "$fails" ] && details+=("$1:
$fails")
  p=0; f=0
  [ -n "$totals" ] && read -r _ p f <<< "$totals"
  passed=$((passed + p)); failed=$((failed + f))
  if [ -z "$totals" ] || { [ "$rc" != 0 ] && [ "$f" = 0 ]; }; then
    why="exit $rc"; [ "$timed" = 1 ] && why="timed out after $limit s"
    crashed+=("$1 ($why)"); failed=$((failed + 1))
    details+=("$1 ($why), its last lines:
$(last_lines "$out")")
  fi
}
pool_binary() { run_binary "${args[$1]}" "$scratch/$1"; }
pool_blas() { run_blas "${pt[$1]}" "$scratch/blas$1" "${pv[$1]}"; }
start=$(date +%s)
args=("$@")
pooled=-1  # the last index started by a pool
for ((i = 0; i < ${#args[@]}; i++)); do
  t=${args[$i]}
  echo "=== $t"
  if parallel "$t"; then
    if [ "$i" -gt "$pooled" ]; then  # a pool for this run of parallel binaries
      n=$i
      while [ "$n" -lt ${#args[@]} ] && parallel "${args[$n]}"; do n=$((n + 1)); done
      start_pool pool_binary $(seq "$i" $((n - 1)))
      pooled=$((n - 1))
    fi
    await "$scratch/$i"
  else
    run_binary "$t" "$scratch/$i"
  fi
  read_result "$scratch/$i" "$t"
  if [ "$i" = "$pooled" ] && parallel "$t"; then wait "$pool" 2>/dev/null; pools=(); fi  # (the pool is done)
  [ "$timed" = 1 ] && out="$out
TIMED OUT: $t ran longer than $limit s (LDM_TEST_TIMEOUT) and was stopped"
  echo "$out" | grep -v -E '^LDM_TEST_(TOTALS|FAILED)'
  count_result "$t"
  # A test binary that needs a GPU passes without one after printing "skipped: no GPU": list it.
  if echo "$out" | grep -q 'skipped: no GPU'; then gpu_skipped+=("$(basename "$t")"); fi
  # Other checks a test case skips visibly (Catch2 WARN "SKIP ..." or "skipped: ...": no data
  # directory, no mpirun, no OLMo tokenizer, no nvcc): listed at the end, since they pass.
  while IFS= read -r w; do other_skipped+=("$(basename "$t"): $w"); done < <(echo "$out" |
    awk '/(^|: )warning:$/ { w = 1; next } w && /^  / { l = $0; sub(/^ +/, "", l); print l; next } { w = 0 }' |
    grep -E '^(SKIP|skipped)' | grep -v 'no GPU' | sort -u)
  echo "=== $t: $secs s"
done
# BLAS variants of the [blas] test cases.
. scripts/blas_cores.sh
variants=${LDM_BLAS_VARIANTS-"native:1 Haswell:1 Haswell:2 SkylakeX:1 Sandybridge:2"}
blas_bins=(); blas_skipped=(); blas_failed=()
if [ -n "$variants" ]; then
  for t in "$@"; do
    [ -n "$("$t" --list-test-names-only "[blas]" 2>/dev/null | grep -v '^$')" ] && blas_bins+=("$t")
  done
fi
if [ ${#blas_bins[@]} -gt 0 ]; then
  v0=$(date +%s)
  native=$(blas_native_core "${blas_bins[0]}")
  echo "=== [blas] test cases of ${#blas_bins[@]} binaries under OpenBLAS core type:threads $variants (native: ${native:-unknown})"
  # the (variant, binary) pairs to run; those of one thread run in a pool as the ThreadSanitizer
  # binaries do (LDM_TEST_JOBS at a time, from the start), the others in turn as they are reached,
  # beside that pool (all are numeric checks that wait on no clock)
  pv=(); pt=()
  for v in $variants; do
    core=${v%%:*}
    if [ "$core" != native ] && ! why=$(blas_core_usable "$core" "${blas_bins[0]}"); then
      echo "=== [blas] $v: skipped: $why"; blas_skipped+=("$v ($why)"); continue
    fi
    for t in "${blas_bins[@]}"; do pv+=("$v"); pt+=("$t"); done
  done
  ones=()
  for ((k = 0; k < ${#pv[@]}; k++)); do [ "${pv[$k]#*:}" = 1 ] && ones+=("$k"); done
  start_pool pool_blas "${ones[@]+"${ones[@]}"}"
  for ((k = 0; k < ${#pv[@]}; k++)); do
    v=${pv[$k]}; t=${pt[$k]}
    core=${v%%:*}; nt=${v#*:}
    if [ "$nt" = 1 ]; then await "$scratch/blas$k"; else run_blas "$t" "$scratch/blas$k" "$v"; fi
    read_result "$scratch/blas$k" "$t [blas] $v"
    count_result "$t [blas] $v"
    if [ -z "$totals" ] || [ "$f" != 0 ] || [ "$rc" != 0 ]; then
      echo "$out" | grep -v -E '^LDM_TEST_(TOTALS|FAILED)'
      if [ "$core" = native ]; then env=""; else env="OPENBLAS_CORETYPE=$core "; fi
      blas_failed+=("${env}OMP_NUM_THREADS=$nt $t '[blas]'")
    fi
    echo "=== [blas] $v $t: $p passed, $f failed, $secs s"
  done
  wait "$pool" 2>/dev/null; pools=()
  echo "=== [blas] variants: $(( $(date +%s) - v0 )) s"
fi
for s in "${blas_skipped[@]+"${blas_skipped[@]}"}"; do echo "skipped (BLAS variant): $s"; done
for s in "${blas_failed[@]+"${blas_failed[@]}"}"; do echo "FAILED under a BLAS variant (rerun: $s)"; done
if [ ${#gpu_skipped[@]} -gt 0 ]; then
  echo "skipped (no GPU): the GPU cases of ${gpu_skipped[*]} passed without running"
fi
for s in "${other_skipped[@]+"${other_skipped[@]}"}"; do echo "skipped (passed without running): $s"; done
# Why the suite failed, near its end (30 lines at most: the whole output is above)
if [ ${#details[@]} -gt 0 ]; then
  echo "---- the failed checks (file:line, expression, expansion) and the crashed binaries' last lines"
  for d in "${details[@]}"; do echo "$d"; done | head -n 30
fi
for c in "${failed_cases[@]+"${failed_cases[@]}"}"; do echo "FAILED test case: $c"; done
for c in "${crashed[@]+"${crashed[@]}"}"; do echo "CRASHED or failed without a report: $c"; done
# Passing test cases delete their scratch files (test/helpers.h); report what is left and the disk.
# (each binary's scratch is test_tmp/ of its build directory, the parent of its test/ directory)
tmp_dirs=()
for t in "$@"; do
  d=$(dirname "$(dirname "$t")")/test_tmp
  case " ${tmp_dirs[*]+"${tmp_dirs[*]}"} " in *" $d "*) ;; *) tmp_dirs+=("$d") ;; esac
done
for d in "${tmp_dirs[@]+"${tmp_dirs[@]}"}"; do
  [ -d "$d" ] && echo "scratch left in $d: $(du -sm "$d" 2>/dev/null | cut -f1) MiB"
done
echo "disk free: $(df -Pm . | awk 'NR == 2 { print $4 }') MiB"
echo "suite time: $(( $(date +%s) - start )) s"
echo "tests: $passed passed, $failed failed"
[ "$failed" = 0 ]
