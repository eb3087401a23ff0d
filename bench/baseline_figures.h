// Writes same-run baselines into a report under a key prefix (e.g. "baselines"), and prints
// progress to stderr. A baseline that cannot be measured is null, with the reason under
// "<prefix>.errors.<name>".
#pragma once

#include "baselines.h"
#include "report.h"

#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <string>

namespace kdn::bench {

struct CommonBaselineOptions {
  unsigned threads = 2;  // "pt": P threads concurrently
  size_t memcpy_bytes_per_thread = 512ull << 20;
  int memcpy_repetitions = 5;
  size_t uds_round_trips = 20000;
  size_t spin_round_trips = 100000;
  bool integrity = true;
  size_t integrity_chunk_bytes = IntegrityOptions{}.chunk_bytes;
  size_t integrity_chunks_per_thread = IntegrityOptions{}.chunks_per_thread;
  size_t integrity_block_bytes = IntegrityOptions{}.block_bytes;
  int integrity_repetitions = IntegrityOptions{}.repetitions;
};

// Copy (1 thread and P threads), the integrity measurement, Unix-socket echo and spin
// ping-pong. <s> is 1t or pt; every *_gbps_<s> figure is a median over repetitions with
// *_min and *_max beside it unless said otherwise:
//   <prefix>.memcpy_gbps_<s> (and _best, = _max), stream_copy_gbps_<s>,
//     copy_gbps_<s> (the faster median of the two) and copy_method_<s> ("memcpy"|"stream");
//   <prefix>.integrity.{copy,staging_store,hashed_store,verify_read}_gbps_<s>,
//     verify_read_method_<s> ("stream"|"cached"), the medians alone of
//     verify_read_{stream,cached,source_hash}_gbps_<s> and hash_gbps_<s>, and the paired
//     ratios {staging_store,hashed_store,verify_read}_vs_copy_<s>;
//   <prefix>.uds_echo_rtt_p50_us, uds_echo_rtt_p99_us, spin_pingpong_rtt_p50_us,
//     spin_pingpong_rtt_p99_us.
// Returns false if any of them failed.
bool add_common_baselines(Report& report, const std::string& prefix, const CommonBaselineOptions& options);

// redis SET/GET of `value_bytes` values: <prefix>.redis_get_gbps, redis_set_gbps,
// redis_value_bytes. An uninstalled redis-server gives nulls and returns true (not a failure).
bool add_redis_baseline(Report& report, const std::string& prefix, uint64_t value_bytes);

// "[kdn-bench] ..." on stderr.
void progress(const char* format, ...) __attribute__((format(printf, 1, 2)));
// `prefix` then the formatted line on stderr (a subcommand's progress).
void vprogress(const char* prefix, const char* format, std::va_list args);

}  // namespace kdn::bench
