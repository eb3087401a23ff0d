// kdn-bench llama-server: TTFT over HTTP of kdn-llama-server processes (miss, kdn hit in another
// process, llama-server's own --cache-ram hit). The measurement is
// python/tools/llama_server_bench.py (Python's standard library, driving real servers over
// HTTP as their clients do); this subcommand runs it with this build's kdnd, kdn-llama-server
// and model, passes every argument through, and returns its exit code (0 measured, 1 a
// measurement failed, 2 usage, 3 a bar failed under --require-bars).
#include "commands.h"

#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

int run_llama_server_bench(int argc, char** argv) {
  std::vector<std::string> args = {KDN_LLAMA_SERVER_BENCH_PYTHON, KDN_LLAMA_SERVER_BENCH_SCRIPT};
  for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
  std::vector<char*> cargs;
  for (std::string& a : args) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  // The caller's settings win, so a benchmark can point at another model or build.
  setenv("KDN_KDND", KDN_LLAMA_SERVER_BENCH_KDND, 0);
  setenv("KDN_LLAMA_SERVER", KDN_LLAMA_SERVER_BENCH_SERVER, 0);
  setenv("KDN_LLAMA_MODEL", KDN_LLAMA_SERVER_BENCH_MODEL, 0);
  setenv("PYTHONDONTWRITEBYTECODE", "1", 0);
  std::fflush(nullptr);
  execv(cargs[0], cargs.data());
  std::fprintf(stderr, "kdn-bench llama-server: cannot run %s: %s\n", cargs[0], std::strerror(errno));
  return 2;
}
