// `kdn-bench baselines`: the same-run baselines on their own, and the helpers that put them
// into any subcommand's report.
#include "baseline_figures.h"
#include "baselines.h"
#include "commands.h"
#include "node_workload.h"
#include "process.h"

#include <CLI/CLI.hpp>

#include <cstdarg>
#include <cstdio>
#include <iostream>
#include <thread>

namespace kdn::bench {
namespace {

std::string key(const std::string& prefix, const char* name) {
  return prefix + "." + name;
}

// The reason sits next to the null figure it explains: <prefix>.errors.<name>.
void record_error(Report& report, const std::string& prefix, const char* name,
                  const Status& status) {
  report.set(key(prefix, "errors.") + name, describe(status));
  progress("%s: %s", name, describe(status).c_str());
}

bool add_memcpy(Report& report, const std::string& prefix, const char* suffix, unsigned threads,
                const CommonBaselineOptions& options) {
  progress("memcpy baseline: %u thread(s) x %zu MiB", threads,
           options.memcpy_bytes_per_thread >> 20);
  Result<MemcpyResult> r =
      memcpy_gbps(threads, options.memcpy_bytes_per_thread, options.memcpy_repetitions);
  std::string name = std::string("memcpy_gbps_") + suffix;
  if (!r.ok()) {
    report.set_null(key(prefix, name.c_str()));
    record_error(report, prefix, name.c_str(), r.status());
    return false;
  }
  report.set(key(prefix, name.c_str()), r->median_gbps);
  report.set(key(prefix, (name + "_best").c_str()), r->best_gbps);
  return true;
}

bool add_latency(Report& report, const std::string& prefix, const char* name,
                 const Result<LatencySummary>& r) {
  std::string base = key(prefix, name);
  if (!r.ok()) {
    report.set_null(base + "_p50_us");
    report.set_null(base + "_p99_us");
    record_error(report, prefix, name, r.status());
    return false;
  }
  report.set(base + "_p50_us", r->p50_us);
  report.set(base + "_p99_us", r->p99_us);
  report.set(base + "_samples", r->samples);
  return true;
}

}  // namespace

void progress(const char* format, ...) {
  std::va_list args;
  va_start(args, format);
  std::fputs("[kdn-bench] ", stderr);
  std::vfprintf(stderr, format, args);
  std::fputc('\n', stderr);
  va_end(args);
}

bool add_common_baselines(Report& report, const std::string& prefix,
                          const CommonBaselineOptions& options) {
  bool ok = add_memcpy(report, prefix, "1t", 1, options);
  ok &= add_memcpy(report, prefix, "pt", options.threads, options);
  report.set(key(prefix, "memcpy_threads_pt"), options.threads);
  report.set(key(prefix, "memcpy_bytes_per_thread"),
             static_cast<uint64_t>(options.memcpy_bytes_per_thread));
  progress("unix socket echo baseline: %zu round trips", options.uds_round_trips);
  ok &= add_latency(report, prefix, "uds_echo_rtt", uds_echo_rtt_us(options.uds_round_trips));
  progress("spin ping-pong baseline: %zu round trips", options.spin_round_trips);
  ok &= add_latency(report, prefix, "spin_pingpong_rtt",
                    spin_pingpong_rtt_us(options.spin_round_trips));
  return ok;
}

bool add_redis_baseline(Report& report, const std::string& prefix, uint64_t value_bytes) {
  progress("redis baseline: %.2f MiB values", static_cast<double>(value_bytes) / (1 << 20));
  RedisOptions options;
  options.value_bytes = value_bytes;
  Result<RedisResult> r = redis_gbps(options);
  report.set(key(prefix, "redis_value_bytes"), value_bytes);
  if (!r.ok()) {
    report.set_null(key(prefix, "redis_get_gbps"));
    report.set_null(key(prefix, "redis_set_gbps"));
    record_error(report, prefix, "redis", r.status());
    return r.status().code() == Code::kUnavailable;
  }
  report.set(key(prefix, "redis_get_gbps"), r->get_gbps);
  report.set(key(prefix, "redis_set_gbps"), r->set_gbps);
  return true;
}

int run_baselines_bench(int argc, char** argv) {
  CLI::App app{
      "kdn-bench baselines: memcpy, Unix-socket echo, spin ping-pong and redis, "
      "measured now on this machine"};
  bool json = false;
  CommonBaselineOptions options;
  uint64_t redis_value_bytes = find_model("llama3-8b")->chunk_bytes();
  size_t memcpy_mib = options.memcpy_bytes_per_thread >> 20;
  app.add_flag("--json", json, "print JSON instead of a table");
  app.add_option("--threads", options.threads, "threads of the concurrent memcpy (P)")
      ->check(CLI::Range(1u, 256u));
  app.add_option("--memcpy-mib", memcpy_mib, "MiB copied per thread per repetition")
      ->check(CLI::Range(size_t{1}, size_t{1} << 16));
  app.add_option("--redis-value-bytes", redis_value_bytes, "redis value size (one kdn chunk)")
      ->check(CLI::Range(uint64_t{8}, uint64_t{1} << 30));
  CLI11_PARSE(app, argc, argv);
  options.memcpy_bytes_per_thread = memcpy_mib << 20;

  Report report;
  bool ok = add_common_baselines(report, "baselines", options);
  ok &= add_redis_baseline(report, "baselines", redis_value_bytes);
  report.set("ratios.spin_vs_uds", ratio(report.number("baselines.spin_pingpong_rtt_p50_us"),
                                         report.number("baselines.uds_echo_rtt_p50_us")));
  report.set("machine.online_cpus", static_cast<int64_t>(std::thread::hardware_concurrency()));
  report.set("machine.loadavg_1m", load_average());
  std::cout << (json ? report.to_json() + "\n" : report.to_table()) << std::flush;
  return ok ? 0 : 1;
}

}  // namespace kdn::bench
