#!/usr/bin/env bash
# Installs what kdn needs (Debian packages), prepares llama.cpp and the model (PyPI, cached in
# an ignored folder), prepares the vLLM environment (PyPI, a venv in a cache outside the work
# tree), configures and builds. Idempotent: a second run only rebuilds what changed.
#
#   scripts/setup.sh            # deps + llama.cpp + vLLM venv + build into build/
#   KDN_SKIP_LLAMA=1 scripts/setup.sh   # without the llama.cpp engine
#   KDN_SKIP_VLLM=1 scripts/setup.sh    # without the Python package and the vLLM connector
#   KDN_SKIP_LMCACHE=1 scripts/setup.sh # without LMCache, the peer kdn-bench vllm runs beside kdn
#   KDN_BUILD_DIR=dir scripts/setup.sh  # another build folder
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

packages=(build-essential cmake ninja-build pkg-config git python3 python3-pip
  liburing-dev libtbb-dev libspdlog-dev libfmt-dev libgtest-dev libgmock-dev
  libcli11-dev libtomlplusplus-dev libxxhash-dev nlohmann-json3-dev libhiredis-dev
  libcpp-httplib-dev redis-server fio libbenchmark-dev clang libclang-rt-14-dev python3-venv python3-dev
  patchelf)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
sudo_cmd=()
[[ $(id -u) -ne 0 ]] && sudo_cmd=(sudo)
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  "${sudo_cmd[@]}" apt-get update -q
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# promtool (Debian's prometheus package, unpacked without installing or starting its service):
# the tests check kdnd's metrics with it.
if [[ ! -x .cache/bin/promtool ]]; then
  mkdir -p .cache/deb .cache/bin
  echo "setup: fetching promtool (Debian package prometheus, unpacked into .cache/bin)"
  (cd .cache/deb && { apt-get download -q prometheus 2>/dev/null || { "${sudo_cmd[@]}" apt-get update -q && apt-get download -q prometheus; }; })
  dpkg-deb --fsys-tarfile .cache/deb/prometheus_*.deb | tar -x -O ./usr/bin/promtool > .cache/bin/promtool.part
  chmod 755 .cache/bin/promtool.part && mv .cache/bin/promtool.part .cache/bin/promtool
  rm -f .cache/deb/prometheus_*.deb
fi

# CI exercises everything: leaving a component out there would let its tests pass by not running.
if [[ -n "${CI:-}" && "${CI}" != 0 && "${CI}" != false ]]; then
  for v in KDN_SKIP_LLAMA KDN_SKIP_VLLM KDN_SKIP_LMCACHE; do
    if [[ -n "${!v:-}" ]]; then
      echo "setup: $v is set under CI; CI builds and tests every component" >&2
      exit 2
    fi
  done
fi

llama_flag=-DKDN_BUILD_LLAMA=OFF
if [[ -z "${KDN_SKIP_LLAMA:-}" && -x scripts/setup-llama.sh ]]; then
  scripts/setup-llama.sh
  llama_flag=-DKDN_BUILD_LLAMA=ON
fi

vllm_flags=(-DKDN_VLLM_DIR= -DKDN_PYTHON= -DKDN_VLLM_MODEL=)
if [[ -z "${KDN_SKIP_VLLM:-}" && -x scripts/setup-vllm.sh ]]; then
  export KDN_VLLM_DIR=${KDN_VLLM_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kdn/vllm}
  scripts/setup-vllm.sh
  vllm_flags=(-DKDN_VLLM_DIR="$KDN_VLLM_DIR")
fi

build=${KDN_BUILD_DIR:-build}
archs=${KDN_CUDA_ARCHS:-}
if [[ -z "$archs" ]]; then
  if [[ -n "${CI:-}" ]]; then archs=90; else archs="80;90"; fi
fi
jobs=${KDN_JOBS:-$(nproc)}
# CI builds the same -O2 code without debug information: it compiles and links faster.
ci_flags=()
if [[ -n "${CI:-}" ]]; then
  for lang in C CXX CUDA; do ci_flags+=("-DCMAKE_${lang}_FLAGS_RELWITHDEBINFO=-O2 -DNDEBUG"); done
fi
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$llama_flag" "${vllm_flags[@]}" \
  "-DKDN_CUDA_ARCHS=$archs" "${ci_flags[@]}" ${KDN_CMAKE_ARGS:-} >/dev/null
echo "setup: building in $build/ ($jobs jobs)"
cmake --build "$build" -j "$jobs"
echo "setup: done; binaries in $build/bin/"
