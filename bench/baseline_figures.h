// Writes same-run baselines into a report under a key prefix (e.g. "baselines"), and prints
// progress to stderr. A baseline that cannot be measured is null, with the reason under
// "<prefix>.errors.<name>".
#pragma once

#include "report.h"

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
};

// memcpy (1 thread and P threads), Unix-socket echo and spin ping-pong:
//   <prefix>.memcpy_gbps_1t, memcpy_gbps_pt (medians; *_best too), uds_echo_rtt_p50_us,
//   uds_echo_rtt_p99_us, spin_pingpong_rtt_p50_us, spin_pingpong_rtt_p99_us.
// Returns false if any of them failed.
bool add_common_baselines(Report& report, const std::string& prefix,
                          const CommonBaselineOptions& options);

// redis SET/GET of `value_bytes` values: <prefix>.redis_get_gbps, redis_set_gbps,
// redis_value_bytes. An uninstalled redis-server gives nulls and returns true (not a failure).
bool add_redis_baseline(Report& report, const std::string& prefix, uint64_t value_bytes);

// "[kdn-bench] ..." on stderr.
void progress(const char* format, ...) __attribute__((format(printf, 1, 2)));

}  // namespace kdn::bench
