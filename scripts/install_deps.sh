#!/usr/bin/env bash
# Installs the Debian packages (and the npm packages used only by the tokenizer cross-check
# tests) that this project needs. Idempotent: does nothing when everything is present, so it
# is safe to call from every README command and make target. Needs root only when something
# is missing. Usage: scripts/install_deps.sh [--no-npm]
#   --no-npm  neither node/npm nor the npm packages (what `make demo` uses: building, training,
#             evaluating and the demo need no JavaScript and no network when the data is local)
# Why npm at all: test/test_tokenizer_xcheck.cpp checks our tokenizers against two independent
# JavaScript encoders (js-tiktoken, tokenizers.js; test/js/package.json). `npm ci` needs the npm
# registry once; when it cannot be reached this script says so and goes on (exit 0): every other
# test runs offline, and only that test fails, naming the missing packages.
set -euo pipefail
case "${1:-}" in -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;; esac
cd "$(dirname "$0")/.."

PKGS=(
  build-essential     # g++, make
  catch2              # Catch2 v2 single header, the test framework
  libpcre2-dev        # GPT-2 pre-tokenization regex (Unicode properties)
  nlohmann-json3-dev  # JSON (encoder.json, tokenizer.json, jsonl, logs)
  libutf8proc-dev     # NFC normalisation for Hugging Face tokenizer.json normalizers
  libopenblas-dev     # BLAS for the CPU reference matmuls
  libbz2-dev          # reading the bz2-compressed HellaSwag copy
  bzip2
  openmpi-bin libopenmpi-dev  # data-parallel CPU training and tests
  python3 python3-numpy python3-torch python3-matplotlib  # PyTorch reference, plots
  nodejs npm          # independent tokenizers (js-tiktoken, transformers.js) for tests
  curl ca-certificates  # download scripts
)

NO_NPM=0
[ "${1:-}" = "--no-npm" ] && NO_NPM=1
missing=()
for p in "${PKGS[@]}"; do
  if [ "$NO_NPM" = 1 ] && { [ "$p" = nodejs ] || [ "$p" = npm ]; }; then continue; fi
  # node and npm may come from elsewhere (e.g. nodesource); accept any working install
  if { [ "$p" = nodejs ] || [ "$p" = npm ]; } && command -v node >/dev/null && command -v npm >/dev/null; then
    continue
  fi
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "[deps] installing Debian packages: ${missing[*]}"
  if [ "$(id -u)" != 0 ]; then
    echo "[deps] error: missing packages and not root; run as root or: apt-get install ${missing[*]}" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "[deps] Debian packages present"
fi

if [ "$NO_NPM" = 0 ] && [ -f test/js/package.json ]; then
  if [ ! -d test/js/node_modules ] || [ test/js/package-lock.json -nt test/js/node_modules ]; then
    echo "[deps] installing npm packages for the tokenizer cross-check test (test/js: js-tiktoken, tokenizers.js)"
    # npm ci deletes node_modules before it downloads: install into a scratch copy and swap it in
    # only when complete, so a failed attempt (offline) keeps a working install. Short network
    # timeouts: an unreachable registry fails in seconds, not after npm's 5-minute default.
    tmp="test/js/.npm-install.$$"   # this process's own scratch copy (git-ignored)
    rm -rf "$tmp" && mkdir "$tmp"
    cp test/js/package.json test/js/package-lock.json "$tmp"/
    if (cd "$tmp" && npm ci --no-audit --no-fund --loglevel=error --fetch-timeout=30000 --fetch-retries=1); then
      rm -rf test/js/node_modules && mv "$tmp/node_modules" test/js/node_modules && touch test/js/node_modules
      rm -rf "$tmp"
    else
      rm -rf "$tmp"
      echo "[deps] warning: 'npm ci' in test/js failed (is the npm registry reachable?). The npm packages" >&2
      echo "[deps]   are needed only by test_tokenizer_xcheck (our tokenizers against independent JavaScript" >&2
      echo "[deps]   encoders), which will fail until they are installed; everything else (build, demo," >&2
      echo "[deps]   the other tests) works offline. Retry with network, or copy a test/js/node_modules." >&2
    fi
  fi
fi
