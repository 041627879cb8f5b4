# scripts/blas_cores.sh — sourced by scripts/run_tests.sh and scripts/tol_margins.sh (not run on
# its own): which OpenBLAS kernel families (OPENBLAS_CORETYPE) this machine can run, so the
# numeric tests can be repeated under several of them (doc/testing.md).
#
#   blas_core_usable CORE BINARY   prints "" and returns 0 when OPENBLAS_CORETYPE=CORE runs here:
#                                  the CPU has the instructions that kernel family needs (from
#                                  /proc/cpuinfo) and BINARY (linked to OpenBLAS) confirms
#                                  "Core: CORE" under OPENBLAS_VERBOSE=2 (a DYNAMIC_ARCH build
#                                  that knows the name). Otherwise prints why not, returns 1.
#   blas_native_core BINARY        prints the kernel family OpenBLAS picks on its own here.

# CPU flags (as /proc/cpuinfo names them) each kernel family's code uses. OpenBLAS does not check
# them when the core type is forced: a missing one is SIGILL, so they are checked here first.
blas_core_flags() {
  case "$1" in
    Prescott) echo "sse2 pni" ;;
    Core2|Atom|Dunnington) echo "sse2 pni ssse3" ;;
    Penryn) echo "sse2 pni ssse3 sse4_1" ;;
    Nehalem) echo "sse2 pni ssse3 sse4_1 sse4_2" ;;
    Sandybridge) echo "avx" ;;
    Haswell|Zen) echo "avx avx2 fma" ;;
    SkylakeX) echo "avx2 fma avx512f avx512dq avx512cd avx512bw avx512vl" ;;
    Cooperlake) echo "avx2 fma avx512f avx512dq avx512cd avx512bw avx512vl avx512_bf16" ;;
    *) return 1 ;;
  esac
}

blas_core_usable() {
  local core=$1 bin=$2 flags have f
  if ! flags=$(blas_core_flags "$core"); then
    echo "core type $core is not in scripts/blas_cores.sh's list"; return 1
  fi
  have=" $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2) "
  for f in $flags; do
    case "$have" in *" $f "*) ;; *) echo "the CPU lacks $f"; return 1 ;; esac
  done
  local said
  said=$(OPENBLAS_CORETYPE=$core OPENBLAS_VERBOSE=2 "$bin" --list-test-names-only 2>&1 >/dev/null)
  if ! grep -qx "Core: $core" <<< "$said" || grep -q "Core not found" <<< "$said"; then
    echo "OpenBLAS did not confirm core $core (not a DYNAMIC_ARCH build, or a name it lacks)"; return 1
  fi
  echo ""
}

blas_native_core() {
  env -u OPENBLAS_CORETYPE OPENBLAS_VERBOSE=2 "$1" --list-test-names-only 2>&1 >/dev/null | sed -n 's/^Core: //p' | tail -1
}
