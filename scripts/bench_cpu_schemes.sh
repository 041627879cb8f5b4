#!/usr/bin/env bash
# CPU benchmark of every depth-aggregation scheme (spec performance.md "On the CPU"): training
# tokens/s of `train_cpu --bench` and of the same model in PyTorch eager (scripts/torch_bench.py,
# Debian's python3-torch, same threads), in the same run, one item after the other, plus the
# peak RSS of each process. Writes results/NAME/{bench.md, bench.csv, bench_tokens.png,
# bench_memory.png} (scripts/torch_bench.py report), rows.jsonl and one log per item.
#
#   scripts/bench_cpu_schemes.sh [--name cpu_small | --out DIR] [--preset small] [-B 4] [-T 256] [--steps 10]
#        [--d-model D] [--bytes]
#        [--schemes "preln hc mhc attnres-full attnres-block ldm-rls ldm-delta ldm-outer ldm-rls-nores"]
#        [--ldm-mode store|unwind|window] [--threads N] [--no-torch] [--timeout S] [--quick]
#
# --d-model D overrides the preset's width; --bytes uses the byte tokenizer (V = 257; the spec's
# byte-level shape: --preset small --d-model 128 -T 128 -B 16 --bytes).
# --quick (CI, test/test_bench_script.cpp): tiny, B=1, T=32, 2 steps (PyTorch: 1 warm-up step),
# schemes "preln ldm-rls". --out DIR replaces results/NAME.
# Scheme names as in scripts/compare_schemes_cpu.sh. --ldm-mode applies to the rls and outer rules
# (delta always runs store). Data: random token ids in a synthetic shard (timing does not depend
# on them); the tokenizer (for V) from $LDM_DATA_DIR or ../shared/data. Needs `make` first
# (BUILD=dir selects the build directory, default build).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
NAME=cpu_small; PRESET=small; B=4; T=256; STEPS=10; THREADS=0; TORCH=1; TIMEOUT=900; LDM_MODE=store
SCHEMES="preln hc mhc attnres-full attnres-block ldm-rls ldm-delta ldm-outer ldm-rls-nores"
QUICK=0; OUT=""; TORCH_WARMUP=2; D_MODEL=0; BYTES=0
while [ $# -gt 0 ]; do
  case "$1" in
    --name) NAME=$2; shift 2 ;; --preset) PRESET=$2; shift 2 ;; -B) B=$2; shift 2 ;; -T) T=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;; --schemes) SCHEMES=$2; shift 2 ;; --threads) THREADS=$2; shift 2 ;;
    --ldm-mode) LDM_MODE=$2; shift 2 ;; --no-torch) TORCH=0; shift ;; --timeout) TIMEOUT=$2; shift 2 ;;
    --quick) QUICK=1; shift ;; --out) OUT=$2; shift 2 ;;
    --d-model) D_MODEL=$2; shift 2 ;; --bytes) BYTES=1; shift ;;
    -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "error: unknown argument $1" >&2; exit 2 ;;
  esac
done
if [ "$QUICK" = 1 ]; then
  PRESET=tiny; B=1; T=32; STEPS=2; TORCH_WARMUP=1; SCHEMES="preln ldm-rls"; [ "$NAME" = cpu_small ] && NAME=cpu_quick
fi
for bin in train_cpu generate_cpu; do
  [ -x "$BUILD/$bin" ] || { echo "error: $BUILD/$bin missing; run make first" >&2; exit 1; }
done
TOK=""; V=50257
[ "$BYTES" = 1 ] && { TOK=bytes; V=257; }
[ -n "$TOK" ] || for d in "${LDM_DATA_DIR:-}" ../shared/data; do
  if [ -n "$d" ] && [ -f "$d/gpt2_tokenizer/encoder.json" ]; then TOK=$d/gpt2_tokenizer; break; fi
done
[ -n "$TOK" ] || { echo "error: no gpt2_tokenizer (set LDM_DATA_DIR or run scripts/download_data.sh)" >&2; exit 1; }
PY=/usr/bin/python3
[ -n "$OUT" ] || OUT=results/$NAME
mkdir -p "$OUT/logs" "$BUILD/bench_data"
rm -f "$OUT/rows.jsonl" "$OUT"/logs/*.txt
# One synthetic uint16 shard (llm.c layout, doc/formats.md) of random ids below V - 1 (no EOT).
data="$BUILD/bench_data/v$V"
mkdir -p "$data"
$PY - "$data/synthetic_train_000001.bin" "$V" <<'PY'
import os, random, struct, sys
n = 1 << 18
rnd = random.Random(1337)
ids = [rnd.randrange(int(sys.argv[2]) - 1) for _ in range(n)]
hdr = [20240520, 1, n] + [0] * 253
with open(sys.argv[1] + ".tmp", "wb") as f:
    f.write(struct.pack("<256i", *hdr))
    f.write(struct.pack("<%dH" % n, *ids))
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
PY
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}  # no spinning while OpenBLAS threads run

scheme_flags() {  # C++ train_cpu flags | torch_bench flags
  case "$1" in
    preln|hc|mhc|attnres-full|attnres-block) echo "--scheme $1|--scheme $1" ;;
    ldm-rls) echo "--scheme ldm --ldm-rule rls --ldm-mode $LDM_MODE|--scheme ldm --ldm-rule rls" ;;
    ldm-delta) echo "--scheme ldm --ldm-rule delta --ldm-mode store|--scheme ldm --ldm-rule delta" ;;
    ldm-outer) echo "--scheme ldm --ldm-rule outer --ldm-mode ${LDM_MODE/window/unwind}|--scheme ldm --ldm-rule outer" ;;
    ldm-rls-nores) echo "--scheme ldm --ldm-rule rls --no-residual --ldm-mode $LDM_MODE|--scheme ldm --ldm-rule rls --no-residual" ;;
    *) echo "error: unknown scheme name $1" >&2; return 1 ;;
  esac
}
SHAPE="$PRESET T=$T B=$B"
dflags=(); tdflags=()
[ "$D_MODEL" != 0 ] && { dflags=(--d-model "$D_MODEL"); tdflags=(--d-model "$D_MODEL"); SHAPE="$PRESET d=$D_MODEL T=$T B=$B"; }
[ "$BYTES" = 1 ] && { tdflags+=(--vocab-size 257); SHAPE="$SHAPE bytes"; }
echo "bench_cpu_schemes: $SHAPE, $STEPS timed steps, threads ${THREADS} (0 = all: $(nproc)), out $OUT"
# One untimed PreLN run first (not in --quick): page cache, tokenizer and BLAS warm (the first
# item was an outlier without it).
[ "$QUICK" = 1 ] || "$BUILD/train_cpu" --preset "$PRESET" "${dflags[@]}" -B "$B" -T "$T" --bench 1 --threads "$THREADS" --quiet \
  --train-data "$data/synthetic_train_*.bin" --tokenizer "$TOK" --sample-every -1 > /dev/null 2>&1 || true
for s in $SCHEMES; do
  f=$(scheme_flags "$s"); cflags=${f%%|*}; tflags=${f#*|}
  # shellcheck disable=SC2086
  $PY scripts/torch_bench.py run --rows "$OUT/rows.jsonl" --impl cpp --label "$s" --shape "$SHAPE" \
    --timeout "$TIMEOUT" --log "$OUT/logs/cpp_$s.txt" -- \
    "$BUILD/train_cpu" --preset "$PRESET" "${dflags[@]}" $cflags -B "$B" -T "$T" --bench "$STEPS" --threads "$THREADS" \
    --quiet --train-data "$data/synthetic_train_*.bin" --tokenizer "$TOK" --sample-every -1
  if [ "$TORCH" = 1 ]; then
    # shellcheck disable=SC2086
    $PY scripts/torch_bench.py run --rows "$OUT/rows.jsonl" --impl torch-eager --label "$s" --shape "$SHAPE" \
      --timeout "$TIMEOUT" --log "$OUT/logs/torch_$s.txt" -- \
      $PY scripts/torch_bench.py bench --preset "$PRESET" "${tdflags[@]}" $tflags -B "$B" -T "$T" --steps "$STEPS" \
      --warmup "$TORCH_WARMUP" --threads "$THREADS" --device cpu --spec-bin "$BUILD/generate_cpu"
  fi
done
$PY scripts/torch_bench.py report --kind cpu --rows "$OUT/rows.jsonl" --out "$OUT" \
  --title "CPU benchmark: every scheme on $SHAPE, C++ reference vs PyTorch eager"
cat "$OUT/bench.md"
