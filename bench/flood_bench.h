// The node benchmark's flood phase (flood_bench.cc): lookup latency of one session while
// another keeps 64 LEASE requests of 65,536 keys each in flight.
#pragma once

#include "report.h"

#include <cstdint>
#include <string>

namespace kdn::bench {

struct FloodOptions {
  std::string kdnd_binary;
  std::string dir;          // for the socket and kdnd's log
  uint32_t in_flight = 64;  // LEASE requests the flooder keeps submitted
  uint32_t keys = 65536;    // keys per LEASE (all cached)
  uint32_t lookup_samples = 20000;
};

// Starts its own kdnd, runs the flood, and writes under <prefix>: lookup_idle_{p50,p99,max}_us,
// lookup_under_flood_{p50,p99,max}_us, flood_leased_chunks_per_s, flood_in_flight,
// flood_keys_per_lease, flood_requests_completed. False (and <prefix>.errors.flood) on failure.
bool add_flood_figures(Report& report, const std::string& prefix, const FloodOptions& options);

}  // namespace kdn::bench
