#include "timed_lanes.h"

#include "stats.h"

#include <kdn/common/clock.h>

#include <algorithm>
#include <barrier>
#include <cstring>
#include <functional>
#include <system_error>
#include <thread>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace kdn::bench {
namespace {

// One lane's clock: start and end of step (method, repetition) at [method * reps + rep].
struct LaneClock {
  std::vector<uint64_t> start_ns, end_ns;
  bool checks_passed = true;
};

void drive_lane(Lane& lane, LaneClock& clock, int methods, int repetitions, std::barrier<>& sync) {
  lane.prepare();
  for (int rep = 0; rep < repetitions; ++rep) {
    for (int step = 0; step < methods; ++step) {
      const int method = (step + rep) % methods;
      const size_t at = static_cast<size_t>(method * repetitions + rep);
      lane.reset(method);
      sync.arrive_and_wait();
      clock.start_ns[at] = now_ns();
      lane.run(method);
      clock.end_ns[at] = now_ns();
      // No lane checks (and loads the memory system) while another still runs the step.
      sync.arrive_and_wait();
      clock.checks_passed &= lane.check(method);
    }
  }
}

Status start_and_join(std::span<Lane* const> lanes, std::vector<LaneClock>& clocks, int methods, int repetitions) {
  std::barrier<> sync(static_cast<std::ptrdiff_t>(lanes.size()));
  std::vector<std::thread> workers;
  Status status;
  for (size_t i = 0; i < lanes.size(); ++i) {
    try {
      workers.emplace_back(drive_lane, std::ref(*lanes[i]), std::ref(clocks[i]), methods, repetitions, std::ref(sync));
    } catch (const std::system_error&) {
      // Lanes that never started must not leave the started ones waiting at the barrier.
      for (size_t missing = i; missing < lanes.size(); ++missing) sync.arrive_and_drop();
      status = Status(Code::kNoMemory, "cannot start a baseline thread");
      break;
    }
  }
  for (std::thread& t : workers) t.join();
  return status;
}

}  // namespace

Result<MethodSamples> run_timed_lanes(std::span<Lane* const> lanes, int methods, int repetitions) noexcept {
  if (lanes.empty() || methods <= 0 || repetitions <= 0) {
    return Status(Code::kInvalidArgument, "timed lanes need lanes, methods and repetitions");
  }
  const size_t steps = static_cast<size_t>(methods * repetitions);
  std::vector<LaneClock> clocks(lanes.size());
  for (LaneClock& c : clocks) {
    c.start_ns.assign(steps, 0);
    c.end_ns.assign(steps, 0);
  }
  KDN_RETURN_IF_ERROR(start_and_join(lanes, clocks, methods, repetitions));
  MethodSamples samples(static_cast<size_t>(methods));
  for (int m = 0; m < methods; ++m) {
    for (int rep = 0; rep < repetitions; ++rep) {
      const size_t at = static_cast<size_t>(m * repetitions + rep);
      uint64_t first = UINT64_MAX, last = 0;
      for (const LaneClock& c : clocks) {
        first = std::min(first, c.start_ns[at]);
        last = std::max(last, c.end_ns[at]);
      }
      samples[static_cast<size_t>(m)].push_back(last - first);
    }
  }
  for (const LaneClock& c : clocks) {
    if (!c.checks_passed) return Status(Code::kInternal, "baseline: a result failed its check");
  }
  return samples;
}

RateSpread rate_spread(const std::vector<uint64_t>& wall_ns, uint64_t bytes) {
  std::vector<double> rates;
  for (uint64_t ns : wall_ns) rates.push_back(gb_per_s(bytes, ns));
  if (rates.empty()) return {};
  RateSpread s;
  s.median_gbps = median(rates);
  s.min_gbps = *std::min_element(rates.begin(), rates.end());
  s.max_gbps = *std::max_element(rates.begin(), rates.end());
  return s;
}

double paired_ratio(const std::vector<uint64_t>& a_ns, const std::vector<uint64_t>& b_ns) {
  std::vector<double> ratios;
  for (size_t i = 0; i < std::min(a_ns.size(), b_ns.size()); ++i) {
    if (a_ns[i] > 0) ratios.push_back(static_cast<double>(b_ns[i]) / static_cast<double>(a_ns[i]));
  }
  return ratios.empty() ? 0.0 : median(ratios);
}

void stream_zero(void* dst, size_t n) noexcept {
#if defined(__x86_64__)
  char* d = static_cast<char*>(dst);
  const size_t head = std::min(n, (16 - (reinterpret_cast<uintptr_t>(d) & 15)) & 15);
  std::memset(d, 0, head);
  size_t i = head;
  const __m128i zero = _mm_setzero_si128();
  for (; i + 16 <= n; i += 16) _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), zero);
  std::memset(d + i, 0, n - i);
  _mm_sfence();
#else
  std::memset(dst, 0, n);
#endif
}

}  // namespace kdn::bench
