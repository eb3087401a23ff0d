// The engines of `kdn-bench soak` and the board they share with the bench.
//
// Each engine is a forked process that links libkdn as a real engine does and runs a random
// mix of operations on a fixed corpus of documents until the bench tells it to stop, or kills
// it. Every chunk it stores is filled with bytes derived from the chunk's key (a stamp), so
// any engine can verify every byte it retrieves without having stored it.
//
// Counters live on a SoakBoard: one shared anonymous mapping created by the bench before it
// forks, so an engine's counts survive its SIGKILL and the engine that replaces it adds to
// them. Every field is a lock-free std::atomic (address-free, so it works across processes).
//
// Ownership: the bench owns the board's mapping (SoakBoard::create, SoakBoard::destroy); engines
// use the copy of the mapping fork gave them. Thread safety: each EngineSlot has one writer
// (its engine, or the bench for the evictions' slot); anyone may read it at any time.
#pragma once

#include <kdn/kdn.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kdn::bench::soak {

// Operations timed and counted. kEvict is the bench's own (admin evictions).
enum class Op : uint32_t { kStore, kLookup, kLease, kRelease, kPrefetch, kEvict, kCount };
inline constexpr uint32_t kOpCount = uint32_t(Op::kCount);
const char* op_name(Op op) noexcept;

// Error kinds: -kdn_status for the library's codes (1..17), and two of the soak's own.
inline constexpr uint32_t kErrBadResult = 18;  // a result that cannot be right (more hits than chunks)
inline constexpr uint32_t kErrKindCount = 19;
const char* error_name(uint32_t kind) noexcept;

// Latency histogram: 16 buckets per power of two of nanoseconds (each bucket spans 4.4%),
// up to 2^40 ns.
inline constexpr uint32_t kBucketsPerOctave = 16;
inline constexpr uint32_t kBuckets = 40 * kBucketsPerOctave;
uint32_t latency_bucket(uint64_t ns) noexcept;
// The middle of a bucket (geometric), in ns.
double bucket_ns(uint32_t bucket) noexcept;

struct EngineSlot {
  // All counters are relaxed: they are totals read at the end (or for progress lines), and
  // no other memory is published through them.
  std::atomic<uint64_t> ops[kOpCount];
  std::atomic<uint64_t> expected[kOpCount][kErrKindCount];
  std::atomic<uint64_t> unexpected[kOpCount][kErrKindCount];
  std::atomic<uint64_t> latency[kOpCount][kBuckets];
  std::atomic<uint64_t> verified_chunks, verified_bytes, wrong_chunks, wrong_bytes;
  // SYNC POINT WRITE (release): the engine stores the pause generation it parked for after it
  // released its leases and pinged kdnd; the bench's acquire load then knows the engine holds
  // nothing and sits connected.
  std::atomic<uint32_t> parked;
};

struct SoakBoard {
  // SYNC POINT WRITE (release, bench) / READ (acquire, engines) for the three words below.
  std::atomic<uint32_t> stop;                // nonzero: engines release everything, disconnect and exit
  std::atomic<uint32_t> pause;               // nonzero: a pause generation; engines park (see parked)
  std::atomic<uint64_t> kdnd_down;           // nonzero while the bench has killed kdnd and not restarted it
  std::atomic<uint64_t> kdnd_up_ns;          // CLOCK_MONOTONIC ns when kdnd last came back up (0: never down)
  static constexpr uint32_t kMaxSlots = 65;  // 64 engines + the bench's evictions
  EngineSlot slots[kMaxSlots];

  // A zeroed board in a MAP_SHARED anonymous mapping; nullptr if mmap fails. Free with destroy.
  static SoakBoard* create() noexcept;
  static void destroy(SoakBoard* board) noexcept;
};
static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<uint32_t>::is_always_lock_free,
              "the board is shared between processes: its atomics must not hide a lock");

// Records one operation's outcome and latency in `slot`. `status` is a kdn_status or
// -kErrBadResult; `expected` says whether a client must expect that error where it happened.
void record(EngineSlot& slot, Op op, int status, bool expected, uint64_t ns) noexcept;

// What the engines work on.
struct SoakWorkload {
  std::string socket_path;
  kdn_model_desc desc{};
  uint64_t seed = 1;
  uint32_t docs = 128;
  uint32_t doc_chunks = 8;
  uint32_t held_leases = 4;                   // leases an engine keeps before releasing (the release op)
  uint64_t expect_outage_ns = 5'000'000'000;  // calls that start this long after kdnd came back
                                              // must not see a disconnection
};

// Token ids of document `doc` (doc_chunks * chunk_tokens of them).
std::vector<int32_t> soak_document(const SoakWorkload& w, uint32_t doc);

// The stamp of the chunk with `key`: `bytes` bytes derived from the key alone.
void fill_stamp(const kdn_key& key, void* dst, size_t bytes) noexcept;
// Bytes of `data` that differ from the stamp of `key` (0: the chunk is the one stored).
uint64_t count_wrong_bytes(const kdn_key& key, const void* data, size_t bytes) noexcept;

// The body of engine `slot` (runs in the forked child); its exit code.
int run_soak_engine(const SoakWorkload& w, SoakBoard* board, uint32_t slot, uint64_t stream_seed);

}  // namespace kdn::bench::soak
