#!/usr/bin/env bash
# Downloads (or copies from a local directory) the raw files the data tool takes, into the
# layout that ldm::find_data_dir() and the tests expect. See doc/formats.md "Raw data and
# download script". Usage: scripts/download_data.sh --help
set -euo pipefail

REPO="$(cd "$(dirname "$0")/.." && pwd)"
HF_ENDPOINT="${HF_ENDPOINT:-https://huggingface.co}"
OPENAI="https://openaipublic.blob.core.windows.net/gpt-2"

usage() {
  cat <<EOF
usage: scripts/download_data.sh <what>... [--out DIR] [--from DIR] [--force]
                                [--sample 10BT|100BT] [--max-files N] [--keep-parquet]

<what> (one or more):
  gpt2-tokenizer   gpt2_tokenizer/encoder.json, vocab.bpe        (OpenAI, sha256 checked)
  olmo-tokenizer   olmo_tokenizer/allenai_gpt-neox-olmo-dolma-v1_5.json (HF hub allenai/gpt-neox-olmo-dolma-v1_5)
  lambada          lambada/lambada_test.jsonl                    (OpenAI, sha256 checked)
  wikitext2        wikitext2/wiki.test.raw                       (from wikitext-2-raw-v1.zip)
  hellaswag        hellaswag/hellaswag_val.jsonl                 (rowanz/hellaswag on GitHub)
  tinyshakespeare  tinyshakespeare/input.txt                     (karpathy/char-rnn, sha256 checked)
  fineweb-edu      fineweb_edu_<SAMPLE>/*.jsonl                  (HF hub HuggingFaceFW/fineweb-edu,
                   sample/10BT or sample/100BT parquet files, converted to jsonl {"text": ...})
  all              everything above except fineweb-edu

Options:
  --out DIR        destination (default: \$LDM_DATA_DIR, else <repo>/../shared/data: the place
                   the tools and tests look for data)
  --from DIR       offline: copy from a local directory with the same layout (for example a
                   copy of shared/data) instead of downloading; hashes are checked the same way.
                   fineweb-edu --from copies DIR/fineweb_edu_sample/fineweb_edu_sample.jsonl;
                   hellaswag --from copies hellaswag_val.jsonl, or else the preprocessed
                   hellaswag_val_full.txt.bz2
  --force          fetch again even when a file is already present (and its hash matches)
  --sample S       fineweb-edu: 10BT (default, ~28 GB of parquet) or 100BT (~270 GB)
  --max-files N    fineweb-edu: only the first N parquet files of the sample (default: all)
  --keep-parquet   fineweb-edu: keep the parquet files next to the jsonl (default: delete)

Every file is written to a temporary name and renamed when complete and verified. Known
sha256 sums (from shared/data/SOURCES.md, and the hub's LFS hashes for the parquet files) are
checked; a mismatch is an error (exit 1) and leaves nothing behind. Where no official hash
exists (wiki.test.raw, the OLMo tokenizer from the hub) a mismatch with the project's reference
copy is only a warning. Needs: curl, sha256sum, python3 (zip, json); fineweb-edu also needs
the python package pyarrow (pip install pyarrow). Set HF_TOKEN for authenticated hub downloads
and HF_ENDPOINT for a hub mirror.

Then build shards, e.g.:
  build/ldm_data shards --tokenizer DIR/gpt2_tokenizer --input 'DIR/fineweb_edu_10BT/*.jsonl' \\
      --out-dir data/edu_fineweb10B --name edufineweb
EOF
}

die() { echo "error: $*" >&2; exit 1; }
note() { echo "[download] $*"; }

# --- known hashes -------------------------------------------------------------------------
# strict: mismatch is an error. advisory: mismatch is a warning (no official hash exists).
declare -A SHA=(
  [gpt2_tokenizer/encoder.json]=196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783
  [gpt2_tokenizer/vocab.bpe]=1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5
  [lambada/lambada_test.jsonl]=4aa8d02cd17c719165fc8a7887fddd641f43fcafa4b1c806ca8abc31fabdb226
  [wikitext2/wiki.test.raw]=173c87a53759e0201f33e0ccf978e510c2042d7f2cb78229d9a50d79b9e7dd08
  [tinyshakespeare/input.txt]=86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed
  [hellaswag/hellaswag_val_full.txt.bz2]=50b637899e4263c2bc456c2dc726c95d2c8cd8e2a552ea5bd7719ce3cb03fe5b
  [fineweb_edu_sample/fineweb_edu_sample.jsonl]=a8130ba3d67c92ecb46865f133391505fb410d6ac379f4e3c4974794197bae48
  [olmo_tokenizer/allenai_gpt-neox-olmo-dolma-v1_5.json]=9ad33b4b39a9f83973c3f8c42a01948dd5b877a28ac9a5356956c4ff4ed0b714
)
declare -A ADVISORY=(
  [wikitext2/wiki.test.raw]=1
  [olmo_tokenizer/allenai_gpt-neox-olmo-dolma-v1_5.json]=1
)

sha_of() { sha256sum "$1" | cut -d' ' -f1; }

# check_hash REL FILE [MODE]: 0 if it matches or no hash is known (or advisory mismatch).
# MODE=strict makes advisory hashes strict too (used for --from: the local copy must be ours).
check_hash() {
  local rel="$1" f="$2" mode="${3:-}" want="${SHA[$1]:-}" got
  got="$(sha_of "$f")"
  if [ -z "$want" ]; then note "$rel: sha256 $got (no reference hash known)"; return 0; fi
  if [ "$got" = "$want" ]; then note "$rel: sha256 ok"; return 0; fi
  if [ -n "${ADVISORY[$rel]:-}" ] && [ "$mode" != strict ]; then
    echo "warning: $rel: sha256 $got differs from the project's reference copy $want (no official hash; kept)" >&2
    return 0
  fi
  echo "error: $rel: sha256 mismatch: got $got, expected $want" >&2
  return 1
}

# present REL: the destination exists and (when a strict hash is known) matches.
present() {
  local rel="$1" f="$OUT/$1"
  [ -f "$f" ] || return 1
  [ "$FORCE" = 1 ] && return 1
  local want="${SHA[$rel]:-}"
  if [ -n "$want" ] && [ -z "${ADVISORY[$rel]:-}" ] && [ "$(sha_of "$f")" != "$want" ]; then
    note "$rel: present but its sha256 does not match; fetching again"
    return 1
  fi
  note "$rel: already present"
  return 0
}

TMPS=()
cleanup() { local t; for t in "${TMPS[@]+"${TMPS[@]}"}"; do rm -rf "$t"; done; }
trap cleanup EXIT

# new_tmp DEST: sets TMP to DEST.part.<pid> and registers it for removal on exit.
new_tmp() { TMP="$1.part.$$"; TMPS+=("$TMP"); }

curl_get() {  # URL DEST
  local hdr=()
  if [ -n "${HF_TOKEN:-}" ] && [[ "$1" == "$HF_ENDPOINT"* ]]; then hdr=(-H "Authorization: Bearer $HF_TOKEN"); fi
  command -v curl >/dev/null || die "curl is needed for downloads (apt-get install curl), or use --from DIR"
  curl -fL --retry 3 --retry-delay 2 --connect-timeout 30 -sS "${hdr[@]+"${hdr[@]}"}" -o "$2" "$1" \
    || die "download failed: $1 (no internet? use --from DIR with local copies)"
}

# fetch REL URL: download (or copy from --from) into OUT/REL atomically, verifying the hash.
fetch() {
  local rel="$1" url="$2" dest="$OUT/$1" tmp
  present "$rel" && return 0
  mkdir -p "$(dirname "$dest")"
  new_tmp "$dest"; tmp="$TMP"
  if [ -n "$FROM" ]; then
    [ -f "$FROM/$rel" ] || die "$FROM/$rel not found (--from)"
    cp "$FROM/$rel" "$tmp"
    chmod 644 "$tmp"
    check_hash "$rel" "$tmp" strict || { rm -f "$tmp"; exit 1; }
  else
    note "$rel <- $url"
    curl_get "$url" "$tmp"
    check_hash "$rel" "$tmp" || { rm -f "$tmp"; exit 1; }
  fi
  mv -f "$tmp" "$dest"
  note "wrote $dest"
}

get_gpt2() {
  fetch gpt2_tokenizer/encoder.json "$OPENAI/encodings/main/encoder.json"
  fetch gpt2_tokenizer/vocab.bpe "$OPENAI/encodings/main/vocab.bpe"
}
get_olmo() {
  fetch olmo_tokenizer/allenai_gpt-neox-olmo-dolma-v1_5.json \
    "$HF_ENDPOINT/allenai/gpt-neox-olmo-dolma-v1_5/resolve/main/tokenizer.json"
}
get_lambada() { fetch lambada/lambada_test.jsonl "$OPENAI/data/lambada_test.jsonl"; }
get_shakespeare() {
  fetch tinyshakespeare/input.txt \
    "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
}

get_wikitext2() {
  local rel=wikitext2/wiki.test.raw dest="$OUT/wikitext2/wiki.test.raw"
  if [ -n "$FROM" ]; then fetch "$rel" unused; return; fi
  present "$rel" && return 0
  mkdir -p "$OUT/wikitext2"
  local zip tmp
  new_tmp "$OUT/wikitext2/wikitext-2-raw-v1.zip"; zip="$TMP"
  new_tmp "$dest"; tmp="$TMP"
  local url="${WIKITEXT_URL:-https://wikitext.smerity.com/wikitext-2-raw-v1.zip}"
  note "$rel <- $url"
  curl_get "$url" "$zip"
  python3 - "$zip" "$tmp" <<'PY' || die "cannot extract wiki.test.raw from the zip"
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    data = z.read("wikitext-2-raw/wiki.test.raw")
open(sys.argv[2], "wb").write(data)
PY
  rm -f "$zip"
  check_hash "$rel" "$tmp" || { rm -f "$tmp"; exit 1; }
  mv -f "$tmp" "$dest"
  note "wrote $dest"
}

get_hellaswag() {
  if [ -n "$FROM" ] && [ ! -f "$FROM/hellaswag/hellaswag_val.jsonl" ]; then
    fetch hellaswag/hellaswag_val_full.txt.bz2 unused
    return
  fi
  fetch hellaswag/hellaswag_val.jsonl \
    "https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl"
}

get_fineweb() {
  if [ -n "$FROM" ]; then
    fetch fineweb_edu_sample/fineweb_edu_sample.jsonl unused
    return
  fi
  case "$SAMPLE" in 10BT|100BT) ;; *) die "--sample must be 10BT or 100BT, not '$SAMPLE'";; esac
  python3 -c 'import pyarrow.parquet' 2>/dev/null \
    || die "fineweb-edu needs the python package pyarrow to read parquet: pip install pyarrow"
  local dir="$OUT/fineweb_edu_$SAMPLE" list
  mkdir -p "$dir"
  new_tmp "$dir/files.json"; list="$TMP"
  curl_get "$HF_ENDPOINT/api/datasets/HuggingFaceFW/fineweb-edu/tree/main/sample/$SAMPLE" "$list"
  # lines: path <tab> sha256 (LFS oid) <tab> size
  local entries
  entries="$(python3 - "$list" "$MAX_FILES" <<'PY'
import json, sys
items = [x for x in json.load(open(sys.argv[1])) if x.get("type") == "file" and x["path"].endswith(".parquet")]
items.sort(key=lambda x: x["path"])
n = int(sys.argv[2]) if sys.argv[2] else len(items)
for x in items[:n]:
    print("%s\t%s\t%s" % (x["path"], (x.get("lfs") or {}).get("oid", ""), x.get("size", "")))
PY
)" || die "cannot read the hub's file list"
  [ -n "$entries" ] || die "no parquet files listed for sample/$SAMPLE"
  local path oid size name pq jsonl tmp
  while IFS=$'\t' read -r path oid size; do
    name="$(basename "$path" .parquet)"
    jsonl="$dir/$name.jsonl"
    if [ -f "$jsonl" ] && [ "$FORCE" != 1 ]; then note "$jsonl: already present"; continue; fi
    pq="$dir/$name.parquet"
    if [ ! -f "$pq" ] || { [ -n "$oid" ] && [ "$(sha_of "$pq")" != "$oid" ]; }; then
      new_tmp "$pq"; tmp="$TMP"
      note "$path ($size bytes) <- hub"
      curl_get "$HF_ENDPOINT/datasets/HuggingFaceFW/fineweb-edu/resolve/main/$path" "$tmp"
      if [ -n "$oid" ] && [ "$(sha_of "$tmp")" != "$oid" ]; then
        rm -f "$tmp"; die "$path: sha256 mismatch with the hub's LFS hash $oid"
      fi
      mv -f "$tmp" "$pq"
    fi
    new_tmp "$jsonl"; tmp="$TMP"
    python3 - "$pq" "$tmp" <<'PY' || die "parquet -> jsonl conversion failed for $pq"
import json, sys
import pyarrow.parquet as pq
f = pq.ParquetFile(sys.argv[1])
with open(sys.argv[2], "w", encoding="utf-8") as out:
    for batch in f.iter_batches(columns=["text"], batch_size=2048):
        for t in batch.column(0).to_pylist():
            out.write(json.dumps({"text": t}, ensure_ascii=False) + "\n")
PY
    mv -f "$tmp" "$jsonl"
    [ "$KEEP_PARQUET" = 1 ] || rm -f "$pq"
    note "wrote $jsonl"
  done <<< "$entries"
}

# --- arguments ----------------------------------------------------------------------------
OUT="" FROM="" FORCE=0 SAMPLE=10BT MAX_FILES="" KEEP_PARQUET=0
WHAT=()
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0;;
    --out) [ $# -ge 2 ] || { echo "error: --out needs a value" >&2; exit 2; }; OUT="$2"; shift 2;;
    --from) [ $# -ge 2 ] || { echo "error: --from needs a value" >&2; exit 2; }; FROM="$2"; shift 2;;
    --force) FORCE=1; shift;;
    --sample) [ $# -ge 2 ] || { echo "error: --sample needs a value" >&2; exit 2; }; SAMPLE="$2"; shift 2;;
    --max-files) [ $# -ge 2 ] || { echo "error: --max-files needs a value" >&2; exit 2; }
                 [[ "$2" =~ ^[0-9]+$ ]] || { echo "error: --max-files expects a number" >&2; exit 2; }
                 MAX_FILES="$2"; shift 2;;
    --keep-parquet) KEEP_PARQUET=1; shift;;
    gpt2-tokenizer|olmo-tokenizer|lambada|wikitext2|hellaswag|tinyshakespeare|fineweb-edu|all) WHAT+=("$1"); shift;;
    *) echo "error: unknown argument '$1' (see --help)" >&2; exit 2;;
  esac
done
[ ${#WHAT[@]} -gt 0 ] || { usage >&2; exit 2; }
if [ -z "$OUT" ]; then
  if [ -n "${LDM_DATA_DIR:-}" ]; then OUT="$LDM_DATA_DIR"; else OUT="$REPO/../shared/data"; fi
fi
if [ -n "$FROM" ]; then
  [ -d "$FROM" ] || die "--from $FROM is not a directory"
  FROM="$(cd "$FROM" && pwd)"
fi
mkdir -p "$OUT" || die "cannot create $OUT"
command -v sha256sum >/dev/null || die "sha256sum is needed (coreutils)"

for w in "${WHAT[@]}"; do
  case "$w" in
    gpt2-tokenizer) get_gpt2;;
    olmo-tokenizer) get_olmo;;
    lambada) get_lambada;;
    wikitext2) get_wikitext2;;
    hellaswag) get_hellaswag;;
    tinyshakespeare) get_shakespeare;;
    fineweb-edu) get_fineweb;;
    all) get_gpt2; get_olmo; get_lambada; get_wikitext2; get_hellaswag; get_shakespeare;;
  esac
done
note "done: $OUT"
