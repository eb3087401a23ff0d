// kdn-bench subcommands. Each takes the arguments after "kdn-bench" (argv[0] is the
// subcommand's name), prints its report to stdout (a table, or JSON with --json) and
// progress to stderr, and returns the process exit code: 0 measured, 1 a measurement failed,
// 2 a usage error or a subcommand this build does not include.
#pragma once

#include <cstdint>
#include <string>

namespace kdn::bench {

int run_baselines_bench(int argc, char** argv);  // same-run baselines alone
int run_node_bench(int argc, char** argv);       // kdnd end to end with engine processes
int run_disk_bench(int argc, char** argv);       // T2 against fio on the same directory
int run_soak_bench(int argc, char** argv);       // engines and kdnd SIGKILLed under load; drift
int run_remote_bench(int argc, char** argv);     // T3 against hiredis on the same Redis Cluster
int run_gpu_bench(int argc, char** argv);        // kdnd's GPU tier against cudaMemcpyAsync

}  // namespace kdn::bench

// Subcommands other components provide (global names, so their files need no kdn header).
int run_kernels_bench(int argc, char** argv);
int run_llama_bench(int argc, char** argv);
int run_vllm_bench(int argc, char** argv);  // execs python/tools/vllm_bench.py
int run_blend_bench(int argc, char** argv);
int run_codec_curve_bench(int argc, char** argv);   // the transform codec's ratio / quality curve
int run_llama_server_bench(int argc, char** argv);  // execs python/tools/llama_server_bench.py
// kdn-bench remote's end-to-end figures, with llama.cpp (builds with KDN_BENCH_HAVE_LLAMA):
// node A's engine prefills a `size`-token prompt through the kdnd at socket_a, node B's engine
// gets it from T3 through the kdnd at socket_b (both in namespace `ns`, with a remote tier on
// one store). JSON: ttft_miss_s, ttft_remote_hit_s, ttft_hit_s (medians of `reps`), or "error".
std::string remote_llama_ttft_json(const std::string& socket_a, const std::string& socket_b, const std::string& ns,
                                   uint32_t size, uint32_t reps);
