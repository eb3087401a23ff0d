// kdn-bench: node-level benchmarks of kdn against the machine's own limits, in one run.
//
//   kdn-bench <subcommand> [--json] [options]      (kdn-bench <subcommand> --help for options)
//
// Subcommands whose sources this build does not include print why and exit 2.
#include "commands.h"

#include <signal.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace {

struct Subcommand {
  const char* name;
  const char* summary;
  int (*run)(int, char**);  // null when not built
  const char* missing;      // why it is not built
};

#if KDN_BENCH_HAVE_NODE
constexpr auto kNode = &kdn::bench::run_node_bench;
constexpr auto kDisk = &kdn::bench::run_disk_bench;
constexpr auto kSoak = &kdn::bench::run_soak_bench;
#else
constexpr int (*kNode)(int, char**) = nullptr;
constexpr int (*kDisk)(int, char**) = nullptr;
constexpr int (*kSoak)(int, char**) = nullptr;
#endif
#if KDN_BENCH_HAVE_REMOTE
constexpr auto kRemote = &kdn::bench::run_remote_bench;
#else
constexpr int (*kRemote)(int, char**) = nullptr;
#endif
#if KDN_BENCH_HAVE_GPU
constexpr auto kGpu = &kdn::bench::run_gpu_bench;
#else
constexpr int (*kGpu)(int, char**) = nullptr;
#endif
#if KDN_BENCH_HAVE_KERNELS
constexpr auto kKernels = &run_kernels_bench;
#else
constexpr int (*kKernels)(int, char**) = nullptr;
#endif
#if KDN_BENCH_HAVE_LLAMA
constexpr auto kLlama = &run_llama_bench;
constexpr auto kBlend = &run_blend_bench;
constexpr auto kCodecCurve = &run_codec_curve_bench;
#else
constexpr int (*kLlama)(int, char**) = nullptr;
constexpr int (*kBlend)(int, char**) = nullptr;
constexpr int (*kCodecCurve)(int, char**) = nullptr;
#endif
#if KDN_BENCH_HAVE_LLAMA_SERVER
constexpr auto kLlamaServer = &run_llama_server_bench;
#else
constexpr int (*kLlamaServer)(int, char**) = nullptr;
#endif
#if KDN_BENCH_HAVE_VLLM
constexpr auto kVllm = &run_vllm_bench;
#else
constexpr int (*kVllm)(int, char**) = nullptr;
#endif

const Subcommand kSubcommands[] = {
    {"node",
     "kdnd end to end: P engine processes, retrieve/store GB/s, lookup RTT, hit ratio, "
     "idle CPU, against same-run baselines",
     kNode, "this kdn-bench was built without libkdn (CMake target kdn)"},
    {"disk",
     "T2 on NVMe: promotion/demotion GB/s per codec, restart recovery, prefetch, lookups under "
     "disk load, against fio on the same directory (--dir DIR)",
     kDisk, "this kdn-bench was built without libkdn (CMake target kdn)"},
    {"soak",
     "P engines at full rate while engines and kdnd are SIGKILLed and restarted: ops, errors, "
     "wrong bytes, kdnd RssAnon and fd drift, p99 per operation (--seconds N)",
     kSoak, "this kdn-bench was built without libkdn (CMake target kdn)"},
    {"remote",
     "T3 on a Redis Cluster it starts: RemoteTier fetch GB/s and lookup RTT against hiredis on the "
     "same cluster (loopback), and fetch GB/s per codec behind a rate-limited link (netns + tc, root)",
     kRemote, "this kdn-bench was built without the remote tier (targets kdn_remote, kdn_redis_servers)"},
    {"gpu",
     "kdnd's GPU tier with this process as the engine: T1/T0 -> engine, engine -> T0, kivi4 decode, "
     "one-chunk latency, decode-step slowdown, against cudaMemcpyAsync h2d/d2h/d2d",
     kGpu, "this kdn-bench was built without CUDA or libkdn (KDN_WITH_CUDA, target kdn)"},
    {"baselines", "memcpy, Unix-socket echo, spin ping-pong and redis baselines alone",
     &kdn::bench::run_baselines_bench, ""},
    {"kernels", "copy, RoPE, codec and blend kernels (CPU; CUDA where a GPU is present)", kKernels,
     "this kdn-bench was built without the kernels (target kdn_kernels)"},
    {"llama", "llama.cpp prefill with and without kdn", kLlama, "this kdn-bench was built without KDN_BUILD_LLAMA=ON"},
    {"llama-server",
     "kdn-llama-server over HTTP: TTFT miss, kdn hit in another process, --cache-ram hit; --throughput: two "
     "servers, concurrent clients",
     kLlamaServer, "this kdn-bench was built without kdn-llama-server (KDN_BUILD_LLAMA=ON, KDN_LLAMA_SERVER=ON)"},
    {"vllm",
     "vLLM replicas (real vLLM, CPU): TTFT miss, kdn hit, own prefix hit, offload; --lmcache side by side, "
     "--throughput the shared-document workload (none / LMCache / kdn, crashes)",
     kVllm, "this kdn-bench was built without the vLLM venv (scripts/setup-vllm.sh, then KDN_VLLM_DIR)"},
    {"blend", "RAG prompts blended from cached documents vs full prefill and prefix caching", kBlend,
     "this kdn-bench was built without KDN_BUILD_LLAMA=ON"},
    {"codec-curve", "transform codec's ratio / top-1 curve beside kivi4 and kivi2 (SmolLM2 f16)", kCodecCurve,
     "this kdn-bench was built without KDN_BUILD_LLAMA=ON"},
};

void print_usage(FILE* out) {
  std::fprintf(out, "usage: kdn-bench <subcommand> [--json] [options]\n\nsubcommands:\n");
  for (const Subcommand& s : kSubcommands) {
    std::fprintf(out, "  %-10s %s%s\n", s.name, s.summary, s.run ? "" : " [not built]");
  }
  std::fprintf(out, "\n'kdn-bench <subcommand> --help' lists its options.\n");
}

}  // namespace

int main(int argc, char** argv) {
  // A daemon or engine that dies mid-write must surface as an error, not kill the bench.
  signal(SIGPIPE, SIG_IGN);
  // Options given before the subcommand (kdn-bench --json node) belong to it.
  std::vector<char*> leading;
  int i = 1;
  for (; i < argc && argv[i][0] == '-'; ++i) leading.push_back(argv[i]);
  if (i == argc) {
    bool help = false;
    for (char* opt : leading) help |= !std::strcmp(opt, "--help") || !std::strcmp(opt, "-h");
    print_usage(help ? stdout : stderr);
    return help ? 0 : 2;
  }
  for (const Subcommand& s : kSubcommands) {
    if (std::strcmp(argv[i], s.name) != 0) continue;
    if (s.run == nullptr) {
      std::fprintf(stderr, "kdn-bench: subcommand '%s' is not available: %s\n", s.name, s.missing);
      return 2;
    }
    std::vector<char*> args = {argv[i]};
    args.insert(args.end(), argv + i + 1, argv + argc);
    args.insert(args.end(), leading.begin(), leading.end());
    args.push_back(nullptr);
    return s.run(static_cast<int>(args.size() - 1), args.data());
  }
  std::fprintf(stderr, "kdn-bench: unknown subcommand '%s'\n\n", argv[i]);
  print_usage(stderr);
  return 2;
}
