#!/usr/bin/env bash
# Builds kdn with CUDA for sm_90 (Release; without llama.cpp and the Python package, whose
# model and interpreter cannot travel) into build-gpu/ and packs gpu-bundle/: every binary and
# test binary in bin/, the shared libraries they need (all but glibc and the CUDA driver) in
# lib/, stripped, with $ORIGIN rpaths, so scripts/gpu-check.sh runs them on a GPU machine that
# has no package registry. Fails if the bundle passes KDN_BUNDLE_LIMIT_MIB (default 60: the
# working tree and the bundle travel together within 64 MiB) once packed as gpu-bundle.tar.xz.
# Idempotent.
#
#   scripts/gpu-bundle.sh                 # build-gpu/ -> gpu-bundle/ and gpu-bundle.tar.xz
#   KDN_BUNDLE_DIR=dir scripts/gpu-bundle.sh
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

if [[ -z "${KDN_BUNDLE_NO_BUILD:-}" ]]; then  # KDN_BUNDLE_NO_BUILD=1: pack build-gpu/ as it is
  KDN_SKIP_LLAMA=1 KDN_SKIP_VLLM=1 KDN_BUILD_DIR=build-gpu KDN_CUDA_ARCHS=90 \
    KDN_CMAKE_ARGS="-DCMAKE_BUILD_TYPE=Release -DKDN_BUILD_PYTHON=OFF -DKDN_WITH_CUDA=ON ${KDN_CMAKE_ARGS:-}" \
    scripts/setup.sh
fi

out=${KDN_BUNDLE_DIR:-gpu-bundle}
limit_mib=${KDN_BUNDLE_LIMIT_MIB:-60}
part="$out.part"
rm -rf "$part"
mkdir -p "$part/bin" "$part/lib"

# What cannot run there: the llama.cpp engine and its tests need the 98 MB model file, the
# Python tests an interpreter with vLLM.
skip='^(kdn-llama|llama_.*|bench_llama_smoke_test|python_.*|vllm_.*)$'
for f in build-gpu/bin/*; do
  name=$(basename "$f")
  [[ -f "$f" && -x "$f" ]] || continue
  [[ "$name" =~ $skip ]] && continue
  cp "$f" "$part/bin/"
done
# The Redis tests start real redis-server processes and ask them with redis-cli.
for p in redis-server redis-cli; do
  if command -v "$p" >/dev/null; then cp "$(command -v "$p")" "$part/bin/"; fi
done

# Shared libraries: everything the loader resolves outside glibc's own and the driver's.
system='/(libc|libm|libpthread|libdl|librt|libresolv|libutil|ld-linux-x86-64|libcuda|libnvidia-[a-z-]*)\.so'
for f in "$part"/bin/*; do
  ldd "$f" 2>/dev/null | awk '/=> \// {print $3}'
done | sort -u | grep -Ev "$system" | while read -r lib; do
  cp -L "$lib" "$part/lib/"
done

# The kdn Python package, for tests/gpu/vllm_gpu_check.py (the machine brings torch). Its
# module is built for this machine's Python; gpu-check.sh skips the check where the versions
# differ. Its libraries join the bundle's.
if compgen -G "build-gpu/python/kdn/_kdn*.so" >/dev/null; then
  mkdir -p "$part/python"
  cp -r build-gpu/python/kdn "$part/python/"
  rm -rf "$part/python/kdn/__pycache__" "$part/python/kdn/vllm/__pycache__"
  ldd "$part"/python/kdn/_kdn*.so 2>/dev/null | awk '/=> \// {print $3}' | grep -Ev "$system" |
    while read -r lib; do cp -L "$lib" "$part/lib/"; done
  patchelf --set-rpath '$ORIGIN/../../lib' "$part"/python/kdn/_kdn*.so
fi

strip --strip-unneeded "$part"/bin/* "$part"/lib/* 2>/dev/null || true
for f in "$part"/bin/*; do patchelf --set-rpath '$ORIGIN/../lib' "$f"; done
for f in "$part"/lib/*; do patchelf --set-rpath '$ORIGIN' "$f"; done

# Every binary must resolve every library from the bundle or the system's glibc.
for f in "$part"/bin/*; do
  if ldd "$f" | grep -q "not found"; then
    echo "gpu-bundle: $f has unresolved libraries:"; ldd "$f" | grep "not found"; exit 1
  fi
done

git rev-parse HEAD > "$part/COMMIT" 2>/dev/null || true
rm -rf "$out"
mv "$part" "$out"
# What travels is the xz archive of the folder (gpu-check.sh unpacks it); the folder stays for
# runs on this machine.
tar -C "$(dirname "$out")" -cf - "$(basename "$out")" | xz -T0 -6 > "$out.tar.xz.part"
mv "$out.tar.xz.part" "$out.tar.xz"
mib() { echo $(( ($1 + (1 << 20) - 1) >> 20 )); }
unpacked=$(mib "$(du -sb "$out" | cut -f1)")
packed=$(mib "$(stat -c %s "$out.tar.xz")")
echo "gpu-bundle: $out/ holds $(ls "$out/bin" | wc -l) binaries and $(ls "$out/lib" | wc -l) libraries, ${unpacked} MiB; $out.tar.xz ${packed} MiB (limit ${limit_mib} MiB)"
if (( packed > limit_mib )); then
  echo "gpu-bundle: $out.tar.xz is over the ${limit_mib} MiB that may travel" >&2
  exit 1
fi
