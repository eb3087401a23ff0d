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

std::string key(const std::string& prefix, const char* name) { return prefix + "." + name; }

// The reason sits next to the null figure it explains: <prefix>.errors.<name>.
void record_error(Report& report, const std::string& prefix, const char* name, const Status& status) {
  report.set(key(prefix, "errors.") + name, describe(status));
  progress("%s: %s", name, describe(status).c_str());
}

// <base> = median, <base>_min, <base>_max.
void set_spread(Report& report, const std::string& base, const RateSpread& r) {
  report.set(base, r.median_gbps);
  report.set(base + "_min", r.min_gbps);
  report.set(base + "_max", r.max_gbps);
}

bool add_copy(Report& report, const std::string& prefix, const char* suffix, unsigned threads,
              const CommonBaselineOptions& options) {
  progress("copy baseline (memcpy, streaming copy): %u thread(s) x %zu MiB", threads,
           options.memcpy_bytes_per_thread >> 20);
  Result<CopyComparison> r = copy_gbps(threads, options.memcpy_bytes_per_thread, options.memcpy_repetitions);
  const std::string s = suffix;
  const std::string memcpy_key = key(prefix, "memcpy_gbps_") + s;
  const std::string stream_key = key(prefix, "stream_copy_gbps_") + s;
  const std::string copy_key = key(prefix, "copy_gbps_") + s;
  if (!r.ok()) {
    for (const std::string& k : {memcpy_key, stream_key, copy_key}) report.set_null(k);
    report.set_null(key(prefix, "copy_method_") + s);
    record_error(report, prefix, ("copy_gbps_" + s).c_str(), r.status());
    return false;
  }
  set_spread(report, memcpy_key, r->memcpy);
  report.set(memcpy_key + "_best", r->memcpy.max_gbps);  // the name before _max; still read
  set_spread(report, stream_key, r->stream);
  set_spread(report, copy_key, r->best());
  report.set(key(prefix, "copy_method_") + s, copy_method_name(r->faster()));
  return true;
}

const char* reader_name(IntegrityMethod m) { return m == IntegrityMethod::kVerifyReadCached ? "cached" : "stream"; }

void set_integrity(Report& report, const std::string& base, const std::string& s, const IntegrityResult& r) {
  auto name = [&](const char* figure) { return base + "." + figure + "_gbps_" + s; };
  set_spread(report, name("copy"), r.of(IntegrityMethod::kCopy));
  set_spread(report, name("staging_store"), r.of(IntegrityMethod::kStagingStore));
  set_spread(report, name("hashed_store"), r.of(IntegrityMethod::kHashedStore));
  set_spread(report, name("verify_read"), r.of(r.verify_read));
  report.set(base + ".verify_read_method_" + s, reader_name(r.verify_read));
  for (IntegrityMethod m : {IntegrityMethod::kVerifyReadStream, IntegrityMethod::kVerifyReadCached,
                            IntegrityMethod::kVerifyReadSource, IntegrityMethod::kHashOnly}) {
    report.set(name(integrity_method_name(m)), r.of(m).median_gbps);
  }
  report.set(base + ".staging_store_vs_copy_" + s, r.ratio(IntegrityMethod::kStagingStore));
  report.set(base + ".hashed_store_vs_copy_" + s, r.ratio(IntegrityMethod::kHashedStore));
  report.set(base + ".verify_read_vs_copy_" + s, r.ratio(r.verify_read));
}

bool add_integrity(Report& report, const std::string& prefix, const char* suffix, unsigned threads,
                   const CommonBaselineOptions& options) {
  IntegrityOptions o;
  o.threads = threads;
  o.chunk_bytes = options.integrity_chunk_bytes;
  o.chunks_per_thread = options.integrity_chunks_per_thread;
  o.block_bytes = options.integrity_block_bytes;
  o.repetitions = options.integrity_repetitions;
  progress("integrity baseline: %u thread(s) x %zu chunks of %.3f MiB", threads, o.chunks_per_thread,
           static_cast<double>(o.chunk_bytes) / (1 << 20));
  Result<IntegrityResult> r = integrity_gbps(o);
  const std::string base = key(prefix, "integrity"), s = suffix;
  if (r.ok()) {
    set_integrity(report, base, s, *r);
    return true;
  }
  for (const char* figure : {"copy_gbps_", "staging_store_gbps_", "hashed_store_gbps_", "verify_read_gbps_",
                             "staging_store_vs_copy_", "hashed_store_vs_copy_", "verify_read_vs_copy_"}) {
    report.set_null(base + "." + figure + s);
  }
  record_error(report, base, ("integrity_" + s).c_str(), r.status());
  return false;
}

bool add_integrity_both(Report& report, const std::string& prefix, const CommonBaselineOptions& options) {
  const std::string base = key(prefix, "integrity");
  report.set(base + ".chunk_bytes", static_cast<uint64_t>(options.integrity_chunk_bytes));
  report.set(base + ".chunks_per_thread", static_cast<uint64_t>(options.integrity_chunks_per_thread));
  report.set(base + ".block_bytes", static_cast<uint64_t>(options.integrity_block_bytes));
  report.set(base + ".threads_pt", options.threads);
  report.set(base + ".repetitions", options.integrity_repetitions);
  report.set(base + ".xxh3_dispatch", integrity_hash_dispatched());
  bool ok = add_integrity(report, prefix, "1t", 1, options);
  ok &= add_integrity(report, prefix, "pt", options.threads, options);
  return ok;
}

bool add_latency(Report& report, const std::string& prefix, const char* name, const Result<LatencySummary>& r) {
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

void vprogress(const char* prefix, const char* format, std::va_list args) {
  std::fputs(prefix, stderr);
  std::vfprintf(stderr, format, args);
  std::fputc('\n', stderr);
}

void progress(const char* format, ...) {
  std::va_list args;
  va_start(args, format);
  vprogress("[kdn-bench] ", format, args);
  va_end(args);
}

bool add_common_baselines(Report& report, const std::string& prefix, const CommonBaselineOptions& options) {
  bool ok = add_copy(report, prefix, "1t", 1, options);
  ok &= add_copy(report, prefix, "pt", options.threads, options);
  report.set(key(prefix, "memcpy_threads_pt"), options.threads);
  report.set(key(prefix, "memcpy_bytes_per_thread"), static_cast<uint64_t>(options.memcpy_bytes_per_thread));
  report.set(key(prefix, "copy_repetitions"), options.memcpy_repetitions);
  if (options.integrity) ok &= add_integrity_both(report, prefix, options);
  progress("unix socket echo baseline: %zu round trips", options.uds_round_trips);
  ok &= add_latency(report, prefix, "uds_echo_rtt", uds_echo_rtt_us(options.uds_round_trips));
  progress("spin ping-pong baseline: %zu round trips", options.spin_round_trips);
  ok &= add_latency(report, prefix, "spin_pingpong_rtt", spin_pingpong_rtt_us(options.spin_round_trips));
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
      "kdn-bench baselines: memcpy and streaming copy, the integrity measurement (staging vs "
      "verify on read), Unix-socket echo, spin ping-pong and redis, measured now on this "
      "machine"};
  bool json = false;
  CommonBaselineOptions options;
  options.integrity_chunk_bytes = find_model("smollm2-135m")->chunk_bytes();
  uint64_t redis_value_bytes = find_model("llama3-8b")->chunk_bytes();
  size_t memcpy_mib = options.memcpy_bytes_per_thread >> 20;
  bool no_integrity = false;
  app.add_flag("--json", json, "print JSON instead of a table");
  app.add_option("--threads", options.threads, "threads of the concurrent copies (P)")->check(CLI::Range(1u, 256u));
  app.add_option("--memcpy-mib", memcpy_mib, "MiB copied per thread per repetition")
      ->check(CLI::Range(size_t{1}, size_t{1} << 16));
  app.add_option("--repetitions", options.memcpy_repetitions, "repetitions of the copy and integrity measurements")
      ->check(CLI::Range(1, 1000));
  app.add_option("--integrity-chunk-bytes", options.integrity_chunk_bytes,
                 "chunk size of the integrity measurement (default: one SmolLM2-135M chunk)")
      ->check(CLI::Range(size_t{4096}, size_t{1} << 30));
  app.add_option("--integrity-chunks", options.integrity_chunks_per_thread,
                 "chunks per thread per repetition of the integrity measurement")
      ->check(CLI::Range(size_t{1}, size_t{1} << 16));
  app.add_option("--integrity-block-bytes", options.integrity_block_bytes,
                 "bytes hashed and copied per step of the fused loops")
      ->check(CLI::Range(size_t{64}, size_t{1} << 30));
  app.add_flag("--no-integrity", no_integrity, "skip the integrity measurement");
  app.add_option("--redis-value-bytes", redis_value_bytes, "redis value size (one kdn chunk)")
      ->check(CLI::Range(uint64_t{8}, uint64_t{1} << 30));
  CLI11_PARSE(app, argc, argv);
  options.memcpy_bytes_per_thread = memcpy_mib << 20;
  options.integrity_repetitions = options.memcpy_repetitions;
  options.integrity = !no_integrity;

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
