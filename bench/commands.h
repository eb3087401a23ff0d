// kdn-bench subcommands. Each takes the arguments after "kdn-bench" (argv[0] is the
// subcommand's name), prints its report to stdout (a table, or JSON with --json) and
// progress to stderr, and returns the process exit code: 0 measured, 1 a measurement failed,
// 2 a usage error or a subcommand this build does not include.
#pragma once

namespace kdn::bench {

int run_baselines_bench(int argc, char** argv);  // same-run baselines alone
int run_node_bench(int argc, char** argv);       // kdnd end to end with engine processes
int run_disk_bench(int argc, char** argv);       // T2 against fio on the same directory
int run_soak_bench(int argc, char** argv);       // engines and kdnd SIGKILLed under load; drift
int run_remote_bench(int argc, char** argv);     // T3 against hiredis on the same Redis Cluster

}  // namespace kdn::bench

// Subcommands other components provide (global names, so their files need no kdn header).
int run_kernels_bench(int argc, char** argv);
int run_llama_bench(int argc, char** argv);
int run_vllm_bench(int argc, char** argv);  // execs python/tools/vllm_bench.py
int run_blend_bench(int argc, char** argv);
