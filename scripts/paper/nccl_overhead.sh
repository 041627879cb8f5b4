#!/usr/bin/env bash
# Cost of the data-parallel path on ONE GPU (issue #10 performance target: NCCL on vs off <= 2%):
# times train_gpt_baselines --bench with the plain path and with --nccl (one-rank communicator)
# for ZeRO-0 and ZeRO-1, each with the reduction after backward (--nccl-overlap 0: flat all-reduce,
# or reduce-scatter + fp32 master all-gather) and overlapped per bucket with backward
# (--nccl-overlap 1: per-bucket all-reduce, or per-owner reduce + bf16 gather), and prints the step
# times and the overheads. Without a GPU: "skipped: no GPU", exit 0.
#
#   scripts/paper/nccl_overhead.sh [--bin build/cuda] [--preset llama-400m] [-B 8] [-T 1024]
#       [--steps 10] [--train-data GLOB] [--tokenizer DIR]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
BIN="$root/build/cuda" PRESET=llama-400m B=8 T=1024 STEPS=10 DATA="" TOK=""
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) BIN="${2:?}"; shift 2 ;;
    --preset) PRESET="${2:?}"; shift 2 ;;
    -B) B="${2:?}"; shift 2 ;;
    -T) T="${2:?}"; shift 2 ;;
    --steps) STEPS="${2:?}"; shift 2 ;;
    --train-data) DATA="${2:?}"; shift 2 ;;
    --tokenizer) TOK="${2:?}"; shift 2 ;;
    -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "error: unknown flag $1" >&2; exit 1 ;;
  esac
done
TR="$BIN/train_gpt_baselines"
[ -x "$TR" ] || { echo "error: $TR not built" >&2; exit 1; }
if ! "$TR" --gpu-info > /dev/null 2>&1; then echo "nccl_overhead: skipped: no GPU"; exit 0; fi
DD="${LDM_DATA_DIR:-$root/../shared/data}"
[ -n "$TOK" ] || TOK="$DD/gpt2_tokenizer"
if [ -z "$DATA" ]; then
  tmp=$(mktemp -d)
  python3 - "$tmp/synthetic_train_000001.bin" <<'PY'
import random, struct, sys
n = 2_000_000
random.seed(1)
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
    f.write(struct.pack("<%dH" % n, *[random.randrange(50257) for _ in range(n)]))
PY
  DATA="$tmp/*train*.bin"
fi
ms() {  # ms <flags...>: step_ms of one --bench run
  "$TR" --preset "$PRESET" -B "$B" -T "$T" --dtype bf16 --bench "$STEPS" --train-data "$DATA" --tokenizer "$TOK" \
    --sample-every -1 --quiet "$@" 2>&1 | grep '^BENCH ' | tail -1 |
    python3 -c 'import json,sys; print("%.3f" % json.loads(sys.stdin.read()[6:])["step_ms"])'
}
off=$(ms)
on0=$(ms --nccl --zero 0 --nccl-overlap 0)
on1=$(ms --nccl --zero 1 --nccl-overlap 0)
ov0=$(ms --nccl --zero 0 --nccl-overlap 1)
ov1=$(ms --nccl --zero 1 --nccl-overlap 1)
python3 - "$off" "$on0" "$on1" "$ov0" "$ov1" <<'PY'
import sys
off, on0, on1, ov0, ov1 = map(float, sys.argv[1:])
print("BENCH nccl_overhead off ms=%.3f" % off)
for name, v in (("nccl_zero0", on0), ("nccl_zero1", on1), ("nccl_zero0_overlap", ov0), ("nccl_zero1_overlap", ov1)):
    ov = 100 * (v / off - 1)
    print("BENCH nccl_overhead %s ms=%.3f overhead=%.2f%% %s" % (name, v, ov, "PASS" if ov <= 2 else "FAIL (target <= 2%)"))
PY
