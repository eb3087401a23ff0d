#!/usr/bin/env bash
# Prepares LMCache, the system kdn-bench runs beside kdn: a venv of its own with the pinned
# LMCache wheel and its three dependencies the vLLM environment lacks (python/lmcache-requirements.txt,
# every wheel checked against its pinned SHA-256, installed --no-deps). Everything else (torch,
# vLLM) comes from the vLLM venv, which a .pth file in this venv's site-packages names: the
# vLLM venv itself stays untouched. Writes lmcache-pin.cmake (the interpreter), which kdn's
# CMake build reads to give kdn-bench and the tests LMCache.
#
# Called by scripts/setup-vllm.sh with the vLLM venv it just prepared:
#   scripts/setup-lmcache.sh CACHE VLLM_VENV VLLM_STAMP
# The venv is named from the vLLM venv's stamp and these pins (lmcache-<stamp>), so it is rebuilt
# when either changes; the .pth names the vLLM venv's stamped path, which only changes with it.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
(($# == 3)) || { echo "usage: setup-lmcache.sh CACHE VLLM_VENV VLLM_STAMP" >&2; exit 2; }
cache=$1 vllm_venv=$2 vllm_stamp=$3
requirements=$root/python/lmcache-requirements.txt

stamp=$(cat "$requirements" <(echo "$vllm_stamp") | sha256sum | cut -c1-16)
venv=$cache/lmcache-$stamp
pin=$cache/lmcache-pin.cmake
vllm_site=$("$vllm_venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')

if [[ ! -f "$venv/.complete" ]]; then
  echo "setup-lmcache: installing the pinned LMCache environment into $venv (PyPI, about 18 MB)"
  rm -rf "$venv"
  # The base interpreter of the vLLM venv (a venv made from the venv's own python would see the
  # base interpreter's packages, not the vLLM venv's; the .pth below adds those).
  base=$("$vllm_venv/bin/python" -c 'import sys; print(sys._base_executable)')
  "$base" -m venv "$venv"
  site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "$vllm_site" >"$site/kdn-vllm-venv.pth"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps --require-hashes \
    -r "$requirements"
  "$venv/bin/python" -c 'import lmcache, vllm, torch' >/dev/null 2>&1 \
    || { echo "setup-lmcache: the venv does not import lmcache, vllm and torch" >&2; exit 1; }
  touch "$venv/.complete"
  for old in "$cache"/lmcache-*; do
    [[ -d "$old" && "$old" != "$venv" ]] && rm -rf "$old"
  done
fi

cat >"$pin.tmp" <<PIN
# Written by scripts/setup-lmcache.sh; read by kdn's CMake build. Do not edit.
set(KDN_LMCACHE_PYTHON "$venv/bin/python" CACHE FILEPATH "" FORCE)
PIN
mv "$pin.tmp" "$pin"
echo "setup-lmcache: ready (venv $venv)"
