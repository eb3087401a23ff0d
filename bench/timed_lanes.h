// Timed lanes: the harness of the bandwidth baselines (memcpy, streaming copy, the integrity
// measurement). Each of P threads works on its own pre-faulted private buffers; all of them
// start every timed step behind one barrier, and a step's wall time runs from the first
// thread's start to the last thread's end, so P lanes give the machine's aggregate rate the
// way P engine processes copying at once would.
//
// A lane offers several methods (e.g. memcpy and streaming copy). Every repetition runs each
// method once, in an order rotated by one per repetition, so methods compared with each other
// are measured seconds apart in the same buffers and none always follows the same one.
//
// Thread safety: run_timed_lanes calls each lane from one thread of its own; a lane touches
// only its own buffers.
#pragma once

#include <kdn/common/status.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace kdn::bench {

// One thread's share of the work. The runner calls, on the lane's own thread:
//   prepare()        once, before any timing: first touch of the buffers, so their pages land
//                    near the core that uses them and no page fault falls in a timed step;
//   then per repetition, per method:
//     reset(method)  untimed, before the barrier that releases every lane;
//     run(method)    timed;
//     check(method)  untimed, after every lane has finished run(); false: a wrong result.
class Lane {
 public:
  virtual ~Lane() = default;
  virtual void prepare() = 0;
  virtual void reset(int method) = 0;
  virtual void run(int method) = 0;
  virtual bool check(int method) = 0;
};

// Wall time in ns of each repetition of each method: samples[method][repetition].
using MethodSamples = std::vector<std::vector<uint64_t>>;

// Runs every lane on a thread of its own, `repetitions` rounds of every one of `methods`:
// the k-th step of round r is method (k + r) % methods. kInternal if any check failed (the
// figures would describe a copy that did not happen), kNoMemory if a thread could not start.
Result<MethodSamples> run_timed_lanes(std::span<Lane* const> lanes, int methods, int repetitions) noexcept;

// A rate's median over repetitions and its spread (GB/s, 1e9 bytes per second).
struct RateSpread {
  double median_gbps = 0;
  double min_gbps = 0;
  double max_gbps = 0;
};

// The rates of `bytes` moved in each of `wall_ns` (non-empty).
RateSpread rate_spread(const std::vector<uint64_t>& wall_ns, uint64_t bytes);

// The median over repetitions of rate(a) / rate(b) = b's time / a's time, each pair taken in
// the same round (a paired ratio: load that moves both alike cancels out). Empty samples: 0.
double paired_ratio(const std::vector<uint64_t>& a_ns, const std::vector<uint64_t>& b_ns);

// Zeroes n bytes with streaming stores (plain memset off x86-64), so a buffer cleared between
// steps is not left in the cache to flatter the next step; ends with a store fence.
void stream_zero(void* dst, size_t n) noexcept;

}  // namespace kdn::bench
