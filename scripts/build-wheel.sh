#!/usr/bin/env bash
# Builds a wheel of the kdn Python package from kdn's own build, with libkdn and the libraries
# it needs inside (beside the module, found through its $ORIGIN rpath), so that
# `pip install kdn-*.whl` into a user's own vLLM environment needs nothing else from kdn.
#
#   scripts/build-wheel.sh [OUT_DIR]      # default: dist/
#
# Environment: KDN_BUILD_DIR (default build/; configured with the Python package, as
# scripts/setup.sh does), KDN_PYTHON (the interpreter the module was built for: the wheel is
# tagged for it; default: the build's). Needs patchelf. No network, no build backend.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$(cd "${KDN_BUILD_DIR:-$root/build}" && pwd)
out=${1:-$root/dist}
python=${KDN_PYTHON:-$(sed -n 's/^KDN_PYTHON:[A-Z]*=//p' "$build/CMakeCache.txt")}
[[ -x "$python" ]] || { echo "build-wheel: no Python interpreter (KDN_PYTHON, or the build's)" >&2; exit 2; }
command -v patchelf >/dev/null || { echo "build-wheel: patchelf is needed" >&2; exit 2; }

cmake --build "$build" --target kdn_python >/dev/null
compgen -G "$build/python/kdn/_kdn*.so" >/dev/null ||
  { echo "build-wheel: $build has no kdn module (configure with the Python package)" >&2; exit 2; }

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
cp -r "$build/python/kdn" "$stage/"
find "$stage" -name __pycache__ -prune -exec rm -rf {} +
# What the loader resolves outside glibc and the C++ runtime (a vLLM environment has those):
# libkdn itself, xxhash, oneTBB.
system='/(libc|libm|libpthread|libdl|librt|libresolv|libutil|ld-linux-x86-64|libstdc\+\+|libgcc_s|libcuda)\.so'
ldd "$stage"/kdn/_kdn*.so | awk '/=> \// {print $3}' | grep -Ev "$system" | sort -u |
  while read -r lib; do cp -L "$lib" "$stage/kdn/"; done
strip --strip-unneeded "$stage"/kdn/*.so* 2>/dev/null || true
for f in "$stage"/kdn/*.so*; do patchelf --set-rpath '$ORIGIN' "$f"; done
if ldd "$stage"/kdn/_kdn*.so | grep -q "not found"; then
  echo "build-wheel: unresolved libraries:" >&2; ldd "$stage"/kdn/_kdn*.so | grep "not found" >&2; exit 1
fi
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/python/pyproject.toml")
"$python" "$root/python/tools/make_wheel.py" "$stage" "$out" --version "$version"
