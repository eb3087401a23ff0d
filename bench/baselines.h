// Same-run baselines: the machine's own limits and the usual alternatives, measured in the
// run that measures kdn, so every kdn figure can be reported as a ratio against them.
//
//   memcpy        the physical limit of a host-memory retrieve or store (T1)
//   UDS echo      what a socket-based control path costs per round trip
//   spin ping-pong the floor of any shared-memory round trip between two processes
//   redis         what a shared KV store on loopback delivers for chunk-sized values
//
// Every function forks helper processes or starts threads and waits for them; call them
// from one thread, with no other benchmark running, and never from a forked engine child.
// Errors are values: a baseline that cannot be measured returns a non-ok Status, and the
// report shows null for it.
#pragma once

#include "stats.h"

#include <kdn/common/status.h>

#include <cstddef>
#include <cstdint>

namespace kdn::bench {

struct MemcpyResult {
  double median_gbps = 0;  // the headline: median over repetitions
  double best_gbps = 0;
  unsigned threads = 0;
  size_t bytes_per_thread = 0;
  int repetitions = 0;
};

// memcpy bandwidth in GB/s (1e9 bytes copied per second, not counting the read and the write
// separately) of `threads` threads copying `bytes_per_thread` each concurrently, between
// pre-faulted private buffers. One repetition is timed from the first thread's start to the
// last thread's end; the result is the median (and the best) of `repetitions` of them.
// Verifies the copies landed.
Result<MemcpyResult> memcpy_gbps(unsigned threads, size_t bytes_per_thread,
                                 int repetitions = 5) noexcept;

// Round trip of a 64-byte message over a Unix stream socket pair between this process and a
// forked echo process, blocking read/write. `warmup` round trips are not recorded.
Result<LatencySummary> uds_echo_rtt_us(size_t round_trips = 20000, size_t warmup = 2000) noexcept;

// Round trip of a counter handed back and forth between this process and a forked peer that
// both spin on one shared cache line (MAP_SHARED anonymous memory, release stores, acquire
// loads). Needs two idle cores to mean anything: on a busy machine each round trip waits for
// the scheduler, so the run stops after `max_seconds` with the samples it has (see
// LatencySummary::samples). Times out (kTimeout) rather than hang if the peer stops answering.
Result<LatencySummary> spin_pingpong_rtt_us(size_t round_trips = 100000, size_t warmup = 10000,
                                            double max_seconds = 10) noexcept;

struct RedisResult {
  double set_gbps = 0;  // SET of `values` distinct keys, value bytes / wall time
  double get_gbps = 0;  // GET of the same keys, each reply copied into an engine buffer
  uint64_t value_bytes = 0;
  size_t values = 0;
  int get_passes = 0;
};

struct RedisOptions {
  uint64_t value_bytes = 0;             // one chunk, as kdn stores it
  uint64_t total_bytes = 512ull << 20;  // values = max(4, total / value_bytes)
  int get_passes = 3;
};

// Starts a private redis-server on a free loopback port (no persistence, temporary
// directory), SETs and GETs chunk-sized values with hiredis, and shuts the server down on
// every path. kUnavailable when redis-server is not installed or hiredis was not found at
// build time.
Result<RedisResult> redis_gbps(const RedisOptions& options) noexcept;

}  // namespace kdn::bench
