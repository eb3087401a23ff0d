// kdn-bench vllm: vLLM replicas with and without kdn. The measurement itself is
// python/tools/vllm_bench.py, run with the vLLM venv's interpreter (scripts/setup-vllm.sh): vLLM is
// a Python engine, and its engines are driven from Python. This subcommand runs that script with
// this build's kdnd, kdn package and model, passes every argument through, and returns its exit
// code (0 measured, 1 a measurement failed, 2 usage, 3 a bar failed under --require-bars).
#include "commands.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

int run_vllm_bench(int argc, char** argv) {
  // --gpu: the device data path on vLLM-shaped blocks, without vLLM (python/tools/vllm_gpu_bench.py).
  const bool gpu = std::any_of(argv + 1, argv + argc, [](const char* a) { return std::strcmp(a, "--gpu") == 0; });
  const std::string script = gpu ? KDN_VLLM_GPU_BENCH_SCRIPT : KDN_VLLM_BENCH_SCRIPT;
  const std::string build_dir = KDN_VLLM_BUILD_DIR;
  std::vector<std::string> args = {KDN_VLLM_PYTHON, script};
  if (gpu) args.insert(args.end(), {"--bin", build_dir + "/bin"});
  for (int i = 1; i < argc; ++i) {
    if (!gpu || std::strcmp(argv[i], "--gpu") != 0) args.emplace_back(argv[i]);
  }
  std::vector<char*> cargs;
  for (std::string& a : args) cargs.push_back(a.data());
  cargs.push_back(nullptr);

  // The caller's settings win, so a benchmark can point at another model or build.
  setenv("KDN_PYTHON", KDN_VLLM_PYTHON, 0);
  setenv("KDN_BUILD_DIR", build_dir.c_str(), 0);
  setenv("KDN_VLLM_MODEL", KDN_VLLM_MODEL_DIR, 0);
  // LMCache's venv (scripts/setup-lmcache.sh), for --lmcache; empty when it was not set up.
  setenv("KDN_LMCACHE_PYTHON", KDN_VLLM_LMCACHE_PYTHON, 0);
  const char* old_path = getenv("PYTHONPATH");
  std::string path = build_dir + "/python";
  if (old_path != nullptr && *old_path != '\0') path += std::string(":") + old_path;
  setenv("PYTHONPATH", path.c_str(), 1);
  std::fflush(nullptr);
  execv(cargs[0], cargs.data());
  std::fprintf(stderr, "kdn-bench vllm: cannot run %s: %s\n", cargs[0], std::strerror(errno));
  return 2;
}
