// The node benchmark's staging-churn phase (staging_churn_bench.cc): how long one session's
// PING waits while other sessions with the largest staging areas open and close in a loop.
#pragma once

#include "report.h"

#include <cstdint>
#include <string>

namespace kdn::bench {

struct StagingChurnOptions {
  std::string kdnd_binary;
  std::string dir;                              // for the socket and kdnd's log
  uint64_t idle_staging_bytes = 4ull << 30;     // asked for and never written (max_staging_bytes)
  uint64_t written_staging_bytes = 1ull << 30;  // asked for and written whole before closing
  uint32_t ping_samples = 20000;                // timed PINGs, idle and under churn each
};

// Starts its own kdnd, runs the churn, and writes under <prefix>: ping_idle_{p50,p99,max}_us,
// ping_under_staging_churn_{p50,p99,max}_us, staging_churn_sessions_per_s,
// staging_churn_written_gib_per_s. False (and <prefix>.errors.staging_churn) on failure.
bool add_staging_churn_figures(Report& report, const std::string& prefix, const StagingChurnOptions& options);

}  // namespace kdn::bench
