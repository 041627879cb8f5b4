#!/usr/bin/env bash
# GPU benchmark of ../shared/spec/performance.md: every scheme x shape, the C++ trainers
# (build/cuda/train_gpt_baselines for preln/hc/mhc/attnres-*, build/cuda/train_ldm for ldm,
# `--bench N`: median step after 2 warm-up steps, MFU against a cuBLASLt bf16 GEMM peak measured
# in the same process, peak device memory) and the same model in PyTorch on the same GPU
# (scripts/torch_bench.py: bf16 autocast, F.scaled_dot_product_attention, eager and
# torch.compile), one item after the other in one run, each with its own timeout. Writes
# results/NAME/{bench.md, bench.csv, bench_tokens.png, bench_memory.png, rows.jsonl, logs/,
# env.txt}: tokens/s, MFU, ms per layer, peak memory, ratios vs PreLN and vs PyTorch, and the
# spec's targets marked met / missed / not measured (scripts/gpu_targets.py; the attention targets
# from the attention workbench's run, unless --no-workbench).
# Inference (cuda/infer.cuh): for every C++ row also one `--bench-infer P:G` call (B sequences,
# prefill of P = T/2 random tokens, then G = min(128, T/2) greedy decode steps with the KV cache):
# prefill tokens/s, decode ms/token, KV cache and peak memory, as an "Inference" section of
# bench.md and infer.csv (infer_rows.jsonl). --no-infer skips it.
#
#   scripts/bench_gpu.sh [--quick] [--name gpu_bench | --out DIR] [--steps 20]
#        [--shapes "llama-400m:2048:8 ..."] [--schemes "preln hc ..."] [--no-torch] [--no-compile]
#        [--timeout S] [--ldm-mode unwind] [--dtype bf16] [--no-workbench] [--prebuilt] [--no-infer]
#        [--window-sweep]
#
# Shapes are PRESET:T:B[:N_LAYER] (default: the spec's list, larger Qwen3 presets with 4 blocks):
#   llama-400m:2048:8 qwen-1.5b:2048:4 qwen3-1.7b:2048:4 qwen3-1.7b:8192:1
#   qwen3-4b:2048:4:4 qwen3-8b:2048:4:4 qwen3-14b:2048:4:4
# Schemes: preln preln-graph hc mhc attnres-full attnres-block ldm-rls ldm-delta ldm-outer
# (ldm-rls-nores too). preln-graph is PreLN with --cuda-graph 1 (C++ only; no PyTorch rows).
# LDM runs rls and outer in --ldm-mode (default unwind), delta in store (not invertible).
# Window sweep: schemes ldm-rls-w1 ldm-rls-w2 ldm-rls-w4 ldm-rls-w8 (rls, --ldm-mode
# window --ldm-window W); --window-sweep appends them to the schemes.
# --quick (about 2.5 minutes on an H200): llama-400m T=2048 B=8, preln, preln-graph, ldm-rls,
# 10 steps, C++ and PyTorch eager (no torch.compile, no workbench), 150 s per item.
# Data: random token ids in a synthetic shard (timing does not depend on them); the GPT-2
# tokenizer (only its vocabulary size is used) from $LDM_DATA_DIR, ../shared/data or
# ./shared/data. Builds the binaries it needs when missing (BUILD=dir, default build; --prebuilt:
# never run make). BENCH_PYTHON names the Python with torch (default: python3, /usr/bin/python3);
# PEER_DEVICE (default cuda; cpu: the PyTorch peer on the host, for test_bench_script's dry run).
# Without a GPU it prints "skipped: no GPU" and exits 0.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
NAME=gpu_bench; OUT=""; STEPS=20; TORCH=1; COMPILE=1; TIMEOUT=900; LDM_MODE=unwind; DTYPE=bf16
WORKBENCH=1; QUICK=0; TORCH_WARMUP=2; PREBUILT=0; INFER=1; WINDOW_SWEEP=0
SHAPES="llama-400m:2048:8 qwen-1.5b:2048:4 qwen3-1.7b:2048:4 qwen3-1.7b:8192:1 qwen3-4b:2048:4:4 qwen3-8b:2048:4:4 qwen3-14b:2048:4:4"
SCHEMES="preln preln-graph hc mhc attnres-full attnres-block ldm-rls ldm-delta ldm-outer"
while [ $# -gt 0 ]; do
  case "$1" in
    --name) NAME=$2; shift 2 ;; --out) OUT=$2; shift 2 ;; --steps) STEPS=$2; shift 2 ;;
    --shapes) SHAPES=$2; shift 2 ;; --schemes) SCHEMES=$2; shift 2 ;; --no-torch) TORCH=0; shift ;;
    --no-compile) COMPILE=0; shift ;; --timeout) TIMEOUT=$2; shift 2 ;; --ldm-mode) LDM_MODE=$2; shift 2 ;;
    --dtype) DTYPE=$2; shift 2 ;; --no-workbench) WORKBENCH=0; shift ;; --quick) QUICK=1; shift ;;
    --prebuilt) PREBUILT=1; shift ;;
    --no-infer) INFER=0; shift ;;
    --window-sweep) WINDOW_SWEEP=1; shift ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "error: unknown argument $1" >&2; exit 2 ;;
  esac
done
if [ "$QUICK" = 1 ]; then
  SHAPES="llama-400m:2048:8"; SCHEMES="preln preln-graph ldm-rls"; STEPS=10; COMPILE=0; WORKBENCH=0
  TIMEOUT=150; TORCH_WARMUP=1; [ "$NAME" = gpu_bench ] && NAME=gpu_quick
fi
[ -n "$OUT" ] || OUT=results/$NAME
[ "$WINDOW_SWEEP" = 1 ] && SCHEMES="$SCHEMES ldm-rls-w1 ldm-rls-w2 ldm-rls-w4 ldm-rls-w8"
# The Python that has PyTorch (on the GPU image a plain `python3`; Debian's /usr/bin/python3 here).
PY=""
for p in ${BENCH_PYTHON:-} python3 /usr/bin/python3; do
  if command -v "$p" >/dev/null && "$p" -c 'import torch' 2>/dev/null; then PY=$p; break; fi
done
[ -n "$PY" ] || { PY=python3; TORCH=0; echo "bench_gpu: no Python with torch found: PyTorch items skipped" >&2; }

if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  echo "skipped: no GPU"
  exit 0
fi

TOK=""
for d in "${LDM_DATA_DIR:-}" ../shared/data shared/data; do
  if [ -n "$d" ] && [ -f "$d/gpt2_tokenizer/encoder.json" ]; then TOK=$d/gpt2_tokenizer; break; fi
done
[ -n "$TOK" ] || { echo "error: no gpt2_tokenizer (set LDM_DATA_DIR to a dir holding gpt2_tokenizer/)" >&2; exit 1; }

need=()
wbs=""; [ "$WORKBENCH" = 1 ] && wbs="cuda/attention cuda/ldm"  # the workbenches run at the end
[ "$PREBUILT" = 1 ] || for b in cuda/train_gpt_baselines cuda/train_ldm generate_cpu $wbs; do [ -x "$BUILD/$b" ] || need+=("$BUILD/$b"); done
if [ ${#need[@]} -gt 0 ]; then
  echo "bench_gpu: building ${need[*]}"
  make --no-print-directory BUILD="$BUILD" -j"$(nproc)" "${need[@]}" > "/tmp/bench_gpu_build.$$.log" 2>&1 ||
    { tail -30 "/tmp/bench_gpu_build.$$.log"; echo "error: build failed" >&2; exit 1; }
fi

mkdir -p "$OUT/logs" "$BUILD/bench_data"
# an earlier run's results go first, so a failed report never leaves them looking like this run's
rm -f "$OUT/rows.jsonl" "$OUT/infer_rows.jsonl" "$OUT"/logs/*.txt "$OUT/bench.md" "$OUT/bench.csv" \
  "$OUT/bench_tokens.png" "$OUT/bench_memory.png" "$OUT/infer.csv"
{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1
  $PY -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1
  git log --oneline -1 2>/dev/null
} > "$OUT/env.txt"
cat "$OUT/env.txt"
SHARD="$BUILD/bench_data/synthetic_train_000001.bin"
[ -f "$SHARD" ] || $PY - "$SHARD" <<'PY'
import os, struct, sys
n = 1 << 22  # 4M ids: > 20 steps of 16k tokens without wrapping much
try:
    import numpy as np
    ids = np.random.default_rng(1337).integers(0, 50257, n, dtype=np.uint16).tobytes()
except ImportError:
    import random
    rnd = random.Random(1337)
    ids = struct.pack("<%dH" % n, *[rnd.randrange(50257) for _ in range(n)])
with open(sys.argv[1] + ".tmp", "wb") as f:
    f.write(struct.pack("<256i", *([20240520, 1, n] + [0] * 253)))
    f.write(ids)
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
PY

scheme_flags() {  # binary | C++ flags | torch_bench flags
  case "$1" in
    preln|hc|mhc|attnres-full|attnres-block) echo "train_gpt_baselines|--scheme $1|--scheme $1" ;;
    preln-graph) echo "train_gpt_baselines|--scheme preln --cuda-graph 1|" ;;  # C++ only (the peer is preln's)
    ldm-rls) echo "train_ldm|--scheme ldm --ldm-rule rls --ldm-mode $LDM_MODE|--scheme ldm --ldm-rule rls" ;;
    ldm-delta) echo "train_ldm|--scheme ldm --ldm-rule delta --ldm-mode store|--scheme ldm --ldm-rule delta" ;;
    ldm-outer) echo "train_ldm|--scheme ldm --ldm-rule outer --ldm-mode ${LDM_MODE/window/unwind}|--scheme ldm --ldm-rule outer" ;;
    ldm-rls-w[0-9]*) echo "train_ldm|--scheme ldm --ldm-rule rls --ldm-mode window --ldm-window ${1#ldm-rls-w}|--scheme ldm --ldm-rule rls" ;;
    ldm-rls-nores) echo "train_ldm|--scheme ldm --ldm-rule rls --no-residual --ldm-mode $LDM_MODE|--scheme ldm --ldm-rule rls --no-residual" ;;
    *) echo "error: unknown scheme name $1" >&2; return 1 ;;
  esac
}

echo "bench_gpu: shapes [$SHAPES], schemes [$SCHEMES], $STEPS steps, torch $TORCH (compile $COMPILE), timeout ${TIMEOUT}s/item, out $OUT"
for shape in $SHAPES; do
  IFS=: read -r preset T B NL <<< "$shape"
  NL=${NL:-0}
  label="$preset T=$T B=$B"; lflag=(); tl=()
  if [ "$NL" != 0 ]; then label="$label L=$NL"; lflag=(--n-layer "$NL"); tl=(--n-layer "$NL"); fi
  tag="${preset}_T${T}_B${B}"; [ "$NL" != 0 ] && tag+="_L$NL"   # log names: one per shape
  # number of blocks of the run (for ms/layer)
  nl_run=$NL
  if [ "$nl_run" = 0 ]; then
    nl_run=$("$BUILD/generate_cpu" --preset "$preset" --print-config 2>/dev/null |
             $PY -c 'import json,sys; print(json.load(sys.stdin)["config"]["n_layer"])' 2>/dev/null || echo 0)
  fi
  for s in $SCHEMES; do
    f=$(scheme_flags "$s") || continue
    bin=${f%%|*}; rest=${f#*|}; cflags=${rest%%|*}; tflags=${rest#*|}
    # shellcheck disable=SC2086
    $PY scripts/torch_bench.py run --rows "$OUT/rows.jsonl" --impl cpp --label "$s" --shape "$label" \
      --n-layer "$nl_run" --timeout "$TIMEOUT" --log "$OUT/logs/cpp_${tag}_${s}.txt" -- \
      "$BUILD/cuda/$bin" --preset "$preset" "${lflag[@]}" $cflags -B "$B" -T "$T" --bench "$STEPS" \
      --dtype "$DTYPE" --quiet --train-data "$BUILD/bench_data/synthetic_train_*.bin" --tokenizer "$TOK" \
      --sample-every -1
    if [ "$INFER" = 1 ] && [ "$s" != preln-graph ]; then  # inference: prefill T/2 tokens, then min(128, T/2) decode steps (graphs: training only)
      P=$((T / 2)); G=$((T / 2 < 128 ? T / 2 : 128))
      ilog="$OUT/logs/cpp_infer_${tag}_${s}.txt"
      # shellcheck disable=SC2086
      timeout -k 5 "$TIMEOUT" "$BUILD/cuda/$bin" --preset "$preset" "${lflag[@]}" $cflags -B "$B" -T "$T" \
        --dtype "$DTYPE" --tokenizer "$TOK" --bench-infer "$P:$G" > "$ilog" 2>&1
      irc=$?
      iline=$(grep '^BENCH_INFER ' "$ilog" | tail -1)
      $PY - "$OUT/infer_rows.jsonl" "$s" "$label" "$irc" "${iline#BENCH_INFER }" "$(grep -m1 'error' "$ilog")" <<'PY'
import json, sys
path, scheme, shape, rc, line, err = sys.argv[1:7]
row = json.loads(line) if line else {}
row["trainer_scheme"] = row.pop("scheme", None)  # the trainer's own name ("ldm" for every LDM rule)
row.update({"scheme": scheme, "shape": shape, "status": "ok" if rc == "0" and line else "fail (exit %s) %s" % (rc, err)})
with open(path, "a") as f:
    f.write(json.dumps(row) + "\n")
PY
    fi
    if [ "$TORCH" = 1 ] && [ -n "$tflags" ]; then
      modes="eager"; [ "$COMPILE" = 1 ] && modes="eager compile"
      for m in $modes; do
        # shellcheck disable=SC2086
        $PY scripts/torch_bench.py run --rows "$OUT/rows.jsonl" --impl "torch-$m" --label "$s" --shape "$label" \
          --n-layer "$nl_run" --timeout "$TIMEOUT" --log "$OUT/logs/torch_${m}_${tag}_${s}.txt" -- \
          $PY scripts/torch_bench.py bench --device "${PEER_DEVICE:-cuda}" --mode "$m" --dtype "$DTYPE" --preset "$preset" \
          "${tl[@]}" $tflags -B "$B" -T "$T" --steps "$STEPS" --warmup "$TORCH_WARMUP" --spec-bin "$BUILD/generate_cpu"
      done
    fi
  done
done

# The attention workbench (every variant's CHECKs and fwd+bwd TFLOP/s): the attention targets.
ATT_FLAG=()
if [ "$WORKBENCH" = 1 ] && [ -x "$BUILD/cuda/attention" ]; then
  timeout -k 5 600 "$BUILD/cuda/attention" > "$OUT/logs/wb_attention.txt" 2>&1
  ATT_FLAG=(--attention "$OUT/logs/wb_attention.txt")
fi
$PY scripts/torch_bench.py report --kind gpu --rows "$OUT/rows.jsonl" --out "$OUT" "${ATT_FLAG[@]}" \
  --title "GPU benchmark ($(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)): C++ trainers vs PyTorch, every scheme" ||
  { echo "error: bench_gpu: the report failed (rows: $OUT/rows.jsonl)" >&2; exit 1; }

# Inference rows: an "Inference" section of bench.md and infer.csv.
if [ "$INFER" = 1 ] && [ -f "$OUT/infer_rows.jsonl" ]; then
  $PY - "$OUT/infer_rows.jsonl" "$OUT/infer.csv" >> "$OUT/bench.md" <<'PY'
import csv, json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
cols = ["shape", "scheme", "status", "B", "prompt_tokens", "decode_steps", "prefill_tokens_per_s", "decode_ms_median",
        "decode_ms_mean", "decode_tokens_per_s", "kv_cache_bytes", "peak_mem_gib"]
with open(sys.argv[2], "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(cols)
    for r in rows:
        w.writerow([r.get(c, "") for c in cols])
print("## Inference (C++ GpuInference: prefill + KV-cache decode, `--bench-infer P:G`)")
print()
print("| shape | scheme | B | P | G | prefill tokens/s | decode ms/token (median) | decode tokens/s | KV cache MiB | peak GiB | status |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    if r["status"] != "ok":
        print("| %s | %s | | | | | | | | | %s |" % (r["shape"], r["scheme"], r["status"].replace("|", "/")))
        continue
    print("| %s | %s | %d | %d | %d | %.0f | %.3f | %.0f | %.1f | %.2f | ok |" % (
        r["shape"], r["scheme"], r["B"], r["prompt_tokens"], r["decode_steps"], r["prefill_tokens_per_s"],
        r["decode_ms_median"], r["decode_tokens_per_s"], r["kv_cache_bytes"] / 2**20, r["peak_mem_gib"]))
print()
PY
fi

# The LDM kernels' achieved bandwidth (bytes the state moves per sublayer): workbench BENCH lines.
if [ "$WORKBENCH" = 1 ] && [ -x "$BUILD/cuda/ldm" ]; then
  wl=$(timeout 300 "$BUILD/cuda/ldm" --quick 2>&1 | grep -E '^(BENCH|CHECK .*FAIL)' || true)
  { echo "## LDM kernels: achieved bandwidth (build/cuda/ldm --quick)"; echo; echo '```'; echo "$wl"; echo '```'; echo; } >> "$OUT/bench.md"
fi
cat "$OUT/bench.md"
