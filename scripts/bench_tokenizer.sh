#!/usr/bin/env bash
# Tokenizer encoding throughput (issue #2, Performance): ldm::Tokenizer (C++) on one core and on
# all cores, side by side with js-tiktoken (GPT-2) and tokenizers.js (OLMo tokenizer.json) on one
# core, on the same documents in the same run: WikiText-2 test (paragraphs) and the FineWeb-Edu
# sample (documents). MB = 10^6 bytes of UTF-8 input. C++ "cold" = first pass with empty word
# caches, "warm" = best of 3 further passes; JS = mean of 3 passes after one warm-up pass.
# MB/CPU-s = the same rate per CPU-second (C++: the encoding thread; JS: the node process), which a
# loaded machine distorts less than wall-clock MB/s.
#
#   scripts/bench_tokenizer.sh [--threads N] [--no-hf]
# Env: BUILD (build dir, default build), LDM_DATA_DIR (data dir, default ../shared/data).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
THREADS=$(nproc)
HF=1
while [ $# -gt 0 ]; do
  case "$1" in
    --threads) THREADS=$2; shift 2 ;;
    --no-hf) HF=0; shift ;;
    -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "error: unknown argument $1" >&2; exit 1 ;;
  esac
done
DATA=${LDM_DATA_DIR:-../shared/data}
[ -d "$DATA" ] || { echo "error: no data directory ($DATA); set LDM_DATA_DIR" >&2; exit 1; }
command -v node >/dev/null || { echo "error: node is not installed (scripts/install_deps.sh)" >&2; exit 1; }
if [ ! -d test/js/node_modules/js-tiktoken ]; then
  (cd test/js && npm ci --no-audit --no-fund --loglevel=error)
fi
make --no-print-directory BUILD="$BUILD" "$BUILD/bench_tokenizer" >/dev/null

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
FILES=(wikitext2="$DATA/wikitext2/wiki.test.raw" fineweb="$DATA/fineweb_edu_sample/fineweb_edu_sample.jsonl")
OLMO="$DATA/olmo_tokenizer/allenai_gpt-neox-olmo-dolma-v1_5.json"

run_pair() {  # label, C++ tokenizer path, js mode args...
  local label=$1 tok=$2; shift 2
  "$BUILD/bench_tokenizer" --tsv --threads "$THREADS" --tokenizer "$tok" --js-input "$TMP" "${FILES[@]}" > "$TMP/cpp.tsv"
  node test/js/encode.mjs "$@" "$TMP/wikitext2.bin" "$TMP/fineweb.bin" > "$TMP/js.txt"
  paste "$TMP/cpp.tsv" "$TMP/js.txt" | awk -v label="$label" -F'[\t ]' '
    { name=$1; mb=$2; ntok=$4; th=$5; c1c=$6; c1w=$7; cnc=$8; cnw=$9; ccpu=$10; jsb=$12; jss=$13; jstok=$14; jscpu=$15;
      js=jsb/1e6/jss; jsc=jsb/1e6/jscpu;
      printf "%-22s %-10s %6.2f MB %7d tok | C++ 1 core %6.2f MB/s (cold %5.2f; %6.2f MB/CPU-s) | C++ %2d cores %6.2f MB/s (cold %5.2f) | JS 1 core %5.2f MB/s (%5.2f MB/CPU-s) | C++/JS per core %5.1fx wall, %5.1fx CPU%s\n",
        label, name, mb, ntok, c1w, c1c, ccpu, th, cnw, cnc, js, jsc, c1w/js, ccpu/jsc, (ntok==jstok ? "" : "  TOKEN COUNT DIFFERS: JS " jstok) }'
}

echo "tokenizer benchmark: $(date -u +%FT%TZ), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), load average $(cut -d' ' -f1-3 /proc/loadavg)"
run_pair "GPT-2 vs js-tiktoken" "$DATA/gpt2_tokenizer" bench-gpt2
if [ "$HF" = 1 ]; then
  run_pair "OLMo vs tokenizers.js" "$OLMO" bench-hf "$OLMO"
fi
