#!/usr/bin/env bash
# Evaluates a list of model checkpoints with build/eval_cpu and writes the comparison table in
# the layout of the paper's: scheme, params, val ppl, WikiText-2 ppl, LAMBADA ppl, LAMBADA acc,
# HellaSwag acc_norm — as markdown (OUT.md) and CSV (OUT.csv), plus one eval_cpu JSON per
# checkpoint (OUT_json/<n>_<name>.json). See doc/evaluation.md.
#
#   scripts/eval_checkpoints.sh --out results/small [--val-data GLOB] [--wikitext F] [--lambada F]
#       [--hellaswag F] [--eval-dir DIR] [--bin build] [--extra "EVAL_CPU FLAGS"] CKPT.model ...
#
#   --eval-dir DIR  takes DIR/wikitext2.bin, DIR/lambada.bin, DIR/hellaswag.bin when present
#                   (as written by `ldm_data wikitext|lambada|hellaswag --out DIR/...`)
#   --bin DIR       directory holding eval_cpu (default: the checkout's build/)
#   --extra "..."   more eval_cpu flags for every checkpoint (e.g. "--max-examples 500 --threads 2")
# Columns of a metric that was not evaluated are "-". Exits 1 (after printing "error: ...")
# when a checkpoint fails to evaluate; the table is written only when every one succeeded.
# Relative paths are taken from the directory it is run in.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"

out="" val="" wt="" lam="" hs="" evdir="" bin="$ROOT/build" extra=""
ckpts=()
die() { echo "error: $*" >&2; exit 1; }
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="${2:?--out needs a value}"; shift 2 ;;
    --val-data) val="${2:?}"; shift 2 ;;
    --wikitext) wt="${2:?}"; shift 2 ;;
    --lambada) lam="${2:?}"; shift 2 ;;
    --hellaswag) hs="${2:?}"; shift 2 ;;
    --eval-dir) evdir="${2:?}"; shift 2 ;;
    --bin) bin="${2:?}"; shift 2 ;;
    --extra) extra="${2:?}"; shift 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    --*) die "unknown flag $1" ;;
    *) ckpts+=("$1"); shift ;;
  esac
done
[ -n "$out" ] || die "--out PREFIX is required"
[ ${#ckpts[@]} -gt 0 ] || die "no checkpoints given"
if [ -n "$evdir" ]; then
  [ -d "$evdir" ] || die "--eval-dir $evdir is not a directory"
  [ -z "$wt" ] && [ -f "$evdir/wikitext2.bin" ] && wt="$evdir/wikitext2.bin"
  [ -z "$lam" ] && [ -f "$evdir/lambada.bin" ] && lam="$evdir/lambada.bin"
  [ -z "$hs" ] && [ -f "$evdir/hellaswag.bin" ] && hs="$evdir/hellaswag.bin"
fi
[ -x "$bin/eval_cpu" ] || die "$bin/eval_cpu not found (build it: make)"
[ -n "$val$wt$lam$hs" ] || die "nothing to evaluate: give --val-data, --wikitext, --lambada, --hellaswag or --eval-dir"
for c in "${ckpts[@]}"; do [ -f "$c" ] || die "checkpoint $c does not exist"; done

jdir="${out}_json"
mkdir -p "$jdir" "$(dirname "$out")"
jsons=()
i=0
for c in "${ckpts[@]}"; do
  i=$((i + 1))
  name=$(basename "$(dirname "$c")")_$(basename "$c" .model)
  j="$jdir/$(printf '%02d' $i)_$name.json"
  args=(--checkpoint "$c" --out "$j")
  [ -n "$val" ] && args+=(--val-data "$val")
  [ -n "$wt" ] && args+=(--wikitext "$wt")
  [ -n "$lam" ] && args+=(--lambada "$lam")
  [ -n "$hs" ] && args+=(--hellaswag "$hs")
  echo "=== [$i/${#ckpts[@]}] $c"
  # shellcheck disable=SC2086
  "$bin/eval_cpu" "${args[@]}" $extra || die "eval_cpu failed on $c"
  jsons+=("$j")
done

/usr/bin/python3 - "$ROOT/scripts" "$out" "${jsons[@]}" <<'PY'
import csv, io, json, os, sys
sys.path.insert(0, sys.argv[1])
from runlog import scheme_label
out, files = sys.argv[2], sys.argv[3:]
cols = ["scheme", "params", "val ppl", "WikiText-2 ppl", "LAMBADA ppl", "LAMBADA acc", "HellaSwag acc_norm"]
rows, srcs = [], []
def get(r, sec, key, fmt):
    return fmt % r[sec][key] if sec in r and r[sec].get(key) is not None else "-"
def label(j):
    # the scheme with the variant options that distinguish runs of one scheme (scripts/runlog.py)
    return scheme_label(dict(j.get("config", {}), scheme=j["scheme"]))
for f in files:
    j = json.load(open(f))
    r = j["results"]
    p = j["params"]
    ps = "%.1fM" % (p / 1e6) if p < 1e9 else "%.2fB" % (p / 1e9)
    rows.append([label(j), ps, get(r, "val", "ppl", "%.2f"), get(r, "wikitext", "word_perplexity", "%.2f"),
                 get(r, "lambada", "ppl", "%.2f"), get(r, "lambada", "acc", "%.4f"),
                 get(r, "hellaswag", "acc_norm", "%.4f")])
    srcs.append("%s (%s, step %d, %d params)" % (j["checkpoint"], j["preset"], j["step"], p))
md = "| " + " | ".join(cols) + " |\n|" + "|".join(["---"] + ["---:"] * (len(cols) - 1)) + "|\n"
for r in rows:
    md += "| " + " | ".join(r) + " |\n"
md += "\nCheckpoints (rows in order):\n\n" + "".join("%d. %s\n" % (i + 1, s) for i, s in enumerate(srcs))
buf = io.StringIO()
w = csv.writer(buf, lineterminator="\n")
w.writerow(cols + ["checkpoint"])
for r, f in zip(rows, files):
    w.writerow(r + [json.load(open(f))["checkpoint"]])
for path, text in ((out + ".md", md), (out + ".csv", buf.getvalue())):
    tmp = "%s.tmp.%d" % (path, os.getpid())
    with open(tmp, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)
print(md)
print("wrote %s.md and %s.csv" % (out, out))
PY
