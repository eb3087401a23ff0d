// Same-run baselines: the machine's own limits and the usual alternatives, measured in the
// run that measures kdn, so every kdn figure can be reported as a ratio against them.
//
//   copy          the physical limit of a host-memory retrieve or store (T1): glibc memcpy
//                 and a streaming-store copy (what kdn copies chunks with), the faster wins
//   integrity     what tamper-evident chunks cost: a store through a staging buffer (two
//                 copies) against hashing fused with the copies (verify on read)
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
#include "timed_lanes.h"

#include <kdn/common/status.h>

#include <cstddef>
#include <cstdint>

namespace kdn::bench {

// One copy method's rates over the repetitions (median, min, max) and what was measured.
struct CopyResult : RateSpread {
  unsigned threads = 0;
  size_t bytes_per_thread = 0;
  int repetitions = 0;
};
using MemcpyResult = CopyResult;

enum class CopyMethod {
  kMemcpy,  // glibc memcpy: its strategy (temporal or streaming stores) depends on the size
  kStream,  // kdn::kernels::detail::copy_bytes with streaming stores + streaming_fence(),
            // as kdn_copy_chunk copies chunks
};
const char* copy_method_name(CopyMethod method) noexcept;  // "memcpy", "stream"

struct CopyComparison {
  CopyResult memcpy, stream;
  // The method with the higher median, and its figures: "the machine's copy bandwidth".
  CopyMethod faster() const noexcept {
    return stream.median_gbps > memcpy.median_gbps ? CopyMethod::kStream : CopyMethod::kMemcpy;
  }
  const CopyResult& best() const noexcept { return faster() == CopyMethod::kStream ? stream : memcpy; }
};

// Copy bandwidth in GB/s (1e9 bytes copied per second, not counting the read and the write
// separately) of `threads` threads copying `bytes_per_thread` each concurrently, between
// pre-faulted private buffers. One repetition is timed from the first thread's start to the
// last thread's end (timed_lanes.h). Between repetitions the destination is cleared with
// streaming stores and after each it is compared with the source, neither timed.
//
// copy_gbps measures memcpy and the streaming copy in the same buffers, one of each per
// repetition in alternating order; memcpy_gbps measures memcpy alone.
Result<CopyComparison> copy_gbps(unsigned threads, size_t bytes_per_thread, int repetitions = 5) noexcept;
Result<CopyResult> memcpy_gbps(unsigned threads, size_t bytes_per_thread, int repetitions = 5) noexcept;

// ---- integrity: staging vs verify on read (integrity_baseline.cc) ----------------------
//
// Two designs for chunks that a client cannot alter once stored:
//   staging         the client writes a chunk into its own staging memory and kdnd copies it
//                   into the shared, client-read-only arena on commit: a store is two
//                   copies, a retrieve one plain copy out of the arena;
//   verify on read  the writer hashes its source (XXH3-128) fused with its copy and sends the
//                   hash; every reader hashes its own private copy, fused with the copy, and
//                   compares.
// Each method moves `chunks_per_thread` chunks of `chunk_bytes` per thread and repetition,
// with streaming stores unless said otherwise, hashing and copying per `block_bytes` block.
enum class IntegrityMethod {
  kCopy,              // src -> dst: the reference (a retrieve under staging)
  kStagingStore,      // src -> staging -> dst: a store under staging (bytes counted once)
  kHashedStore,       // per block: hash src, then stream it to dst: the writer under verify
                      // on read
  kVerifyReadSource,  // per block: hash src, then stream it to dst, compare: NOT a valid
                      // reader (the shared source may change between the hash's read and
                      // the copy's); shown as the ceiling of an honest reader whose every
                      // load feeds both the store and the hash, which XXH3's API cannot do
  kVerifyReadStream,  // per block: stream src to dst, then hash the private dst block
  kVerifyReadCached,  // per block: memcpy src to dst (lands in cache), hash the dst block
  kHashOnly,          // XXH3-128 of src alone, compared: the hash's own rate
};
inline constexpr int kIntegrityMethods = 7;
const char* integrity_method_name(IntegrityMethod method) noexcept;
// True when XXH3 runs through libxxhash's run-time dispatch (the widest vector loop the CPU
// has); false: the library's baseline loop.
bool integrity_hash_dispatched() noexcept;

struct IntegrityOptions {
  unsigned threads = 1;
  size_t chunk_bytes = 5898240;   // one SmolLM2-135M chunk (5.625 MiB)
  size_t chunks_per_thread = 32;  // one 8K-token SmolLM2 document, 180 MiB: well past the L3
  size_t block_bytes = 64 << 10;  // hashed while in L2, then copied
  int repetitions = 5;
};

struct IntegrityResult {
  RateSpread rate[kIntegrityMethods];  // by IntegrityMethod
  // Paired ratios against kCopy (timed_lanes.h paired_ratio), by IntegrityMethod.
  double vs_copy[kIntegrityMethods] = {};
  // The honest reader: the faster of kVerifyReadStream and kVerifyReadCached.
  IntegrityMethod verify_read = IntegrityMethod::kVerifyReadStream;
  const RateSpread& of(IntegrityMethod m) const noexcept { return rate[static_cast<int>(m)]; }
  double ratio(IntegrityMethod m) const noexcept { return vs_copy[static_cast<int>(m)]; }
};

// Measures every IntegrityMethod on `threads` lanes (timed_lanes.h). Every destination is
// compared with its source and every hash with one computed beforehand; a mismatch is
// kInternal.
Result<IntegrityResult> integrity_gbps(const IntegrityOptions& options) noexcept;

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
