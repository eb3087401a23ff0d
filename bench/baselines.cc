// Copy, Unix-socket echo and spin ping-pong baselines (redis lives in redis_baseline.cc, the
// integrity measurement in integrity_baseline.cc).
#include "baselines.h"

#include "page_buffer.h"
#include "process.h"

#include <kdn/common/clock.h>
#include <kdn/kernels/stream_copy.h>

#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>
#include <vector>

namespace kdn::bench {
namespace {

// ---- memcpy and streaming copy ------------------------------------------------------------

// One thread's buffers; method i of the lane is methods[i].
class CopyLane final : public Lane {
 public:
  CopyLane(PageBuffer src, PageBuffer dst, std::vector<CopyMethod> methods, uint64_t seed)
      : src_(std::move(src)), dst_(std::move(dst)), methods_(std::move(methods)), seed_(seed) {}

  void prepare() override {
    src_.fill_pattern(seed_);
    std::memset(dst_.data(), 0, dst_.size());
  }
  void reset(int) override { stream_zero(dst_.data(), dst_.size()); }
  void run(int method) override {
    if (methods_[static_cast<size_t>(method)] == CopyMethod::kMemcpy) {
      std::memcpy(dst_.data(), src_.data(), src_.size());
    } else {
      kernels::detail::copy_bytes(dst_.data(), src_.data(), src_.size(), /*stream=*/true);
      kernels::detail::streaming_fence();
    }
  }
  bool check(int) override { return std::memcmp(src_.data(), dst_.data(), src_.size()) == 0; }

 private:
  PageBuffer src_, dst_;
  std::vector<CopyMethod> methods_;
  uint64_t seed_;
};

// The buffers are first touched by the thread that copies them (prepare), not here.
Result<std::vector<std::unique_ptr<Lane>>> make_copy_lanes(unsigned threads, size_t bytes,
                                                           const std::vector<CopyMethod>& methods) {
  std::vector<std::unique_ptr<Lane>> lanes;
  for (unsigned i = 0; i < threads; ++i) {
    Result<PageBuffer> src = PageBuffer::allocate(bytes, /*prefault=*/false);
    if (!src.ok()) return src.status();
    Result<PageBuffer> dst = PageBuffer::allocate(bytes, /*prefault=*/false);
    if (!dst.ok()) return dst.status();
    lanes.push_back(std::make_unique<CopyLane>(std::move(src).value(), std::move(dst).value(), methods, i + 1));
  }
  return lanes;
}

Result<std::vector<CopyResult>> measure_copies(unsigned threads, size_t bytes_per_thread, int repetitions,
                                               const std::vector<CopyMethod>& methods) {
  if (threads == 0 || bytes_per_thread == 0 || repetitions <= 0) {
    return Status(Code::kInvalidArgument, "copy baseline needs threads, bytes, repetitions");
  }
  Result<std::vector<std::unique_ptr<Lane>>> lanes = make_copy_lanes(threads, bytes_per_thread, methods);
  if (!lanes.ok()) return lanes.status();
  std::vector<Lane*> raw;
  for (const std::unique_ptr<Lane>& lane : *lanes) raw.push_back(lane.get());
  Result<MethodSamples> samples = run_timed_lanes(raw, static_cast<int>(methods.size()), repetitions);
  if (!samples.ok()) return samples.status();
  std::vector<CopyResult> results;
  for (const std::vector<uint64_t>& wall_ns : *samples) {
    CopyResult r;
    static_cast<RateSpread&>(r) = rate_spread(wall_ns, static_cast<uint64_t>(threads) * bytes_per_thread);
    r.threads = threads;
    r.bytes_per_thread = bytes_per_thread;
    r.repetitions = repetitions;
    results.push_back(r);
  }
  return results;
}

// ---- Unix socket echo --------------------------------------------------------------------

constexpr size_t kEchoBytes = 64;

bool write_all(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool read_all(int fd, void* data, size_t n) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    ssize_t r = read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;  // EOF, timeout or error
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

int echo_until_eof(int fd) {
  char msg[kEchoBytes];
  while (read_all(fd, msg, sizeof msg)) {
    if (!write_all(fd, msg, sizeof msg)) return 1;
  }
  return 0;
}

// ---- spin ping-pong ----------------------------------------------------------------------

// The one cache line both processes spin on. The parent writes odd values, the peer answers
// with the next even value; kStop ends the peer.
struct alignas(64) PingPongLine {
  std::atomic<uint64_t> seq{0};
};
static_assert(std::atomic<uint64_t>::is_always_lock_free,
              "the counter is shared between processes: it must be address-free");
constexpr uint64_t kStop = UINT64_MAX;
constexpr uint64_t kSpinTimeoutNs = 5'000'000'000ull;

// Spins until `line` holds `want` (or kStop); false after kSpinTimeoutNs without it.
bool spin_until(const PingPongLine& line, uint64_t want) {
  uint64_t deadline = 0;
  for (uint32_t spins = 1;; ++spins) {
    // SYNC POINT READ: acquire pairs with the other process's release store of `want`.
    uint64_t v = line.seq.load(std::memory_order_acquire);
    if (v == want || v == kStop) return v == want;
    if ((spins & 4095u) == 0) {
      uint64_t now = now_ns();
      if (deadline == 0) deadline = now + kSpinTimeoutNs;
      if (now > deadline) return false;
    }
    cpu_relax();
  }
}

int answer_pings(PingPongLine& line) {
  for (uint64_t ping = 1;; ping += 2) {
    if (!spin_until(line, ping)) return 0;  // stopped, or the parent went away
    // SYNC POINT WRITE: release publishes the answer; there is no other data to order.
    line.seq.store(ping + 1, std::memory_order_release);
  }
}

Result<LatencySummary> time_pings(PingPongLine& line, size_t round_trips, size_t warmup, uint64_t budget_ns) {
  std::vector<uint64_t> samples;
  samples.reserve(round_trips);
  uint64_t deadline = now_ns() + budget_ns;
  for (size_t i = 0; i < warmup + round_trips; ++i) {
    if (now_ns() > deadline && !samples.empty()) break;
    uint64_t ping = 2 * i + 1;
    uint64_t t0 = now_ns();
    // SYNC POINT WRITE: release hands the line to the peer.
    line.seq.store(ping, std::memory_order_release);
    if (!spin_until(line, ping + 1)) return Status(Code::kTimeout, "ping-pong peer stopped");
    uint64_t t1 = now_ns();
    if (i >= warmup) samples.push_back(t1 - t0);
  }
  return summarize_ns(samples);
}

}  // namespace

const char* copy_method_name(CopyMethod method) noexcept { return method == CopyMethod::kStream ? "stream" : "memcpy"; }

Result<CopyComparison> copy_gbps(unsigned threads, size_t bytes_per_thread, int repetitions) noexcept {
  Result<std::vector<CopyResult>> r =
      measure_copies(threads, bytes_per_thread, repetitions, {CopyMethod::kMemcpy, CopyMethod::kStream});
  if (!r.ok()) return r.status();
  return CopyComparison{(*r)[0], (*r)[1]};
}

Result<CopyResult> memcpy_gbps(unsigned threads, size_t bytes_per_thread, int repetitions) noexcept {
  Result<std::vector<CopyResult>> r = measure_copies(threads, bytes_per_thread, repetitions, {CopyMethod::kMemcpy});
  if (!r.ok()) return r.status();
  return (*r)[0];
}

Result<LatencySummary> uds_echo_rtt_us(size_t round_trips, size_t warmup) noexcept {
  if (round_trips == 0) return Status(Code::kInvalidArgument, "no round trips");
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
    return Status::from_errno("socketpair", errno);
  }
  int mine = fds[0], peer = fds[1];
  Result<ChildProcess> echo = fork_child([mine, peer] {
    close(mine);
    return echo_until_eof(peer);
  });
  close(peer);
  if (!echo.ok()) {
    close(mine);
    return echo.status();
  }
  timeval timeout{5, 0};  // a stalled peer must not hang the bench
  setsockopt(mine, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  std::vector<uint64_t> samples;
  samples.reserve(round_trips);
  char msg[kEchoBytes] = {};
  Status status;
  for (size_t i = 0; i < warmup + round_trips && status.ok(); ++i) {
    msg[0] = static_cast<char>(i);
    uint64_t t0 = now_ns();
    if (!write_all(mine, msg, sizeof msg) || !read_all(mine, msg, sizeof msg)) {
      status = Status::from_errno("unix socket echo", errno);
    }
    uint64_t t1 = now_ns();
    if (i >= warmup) samples.push_back(t1 - t0);
  }
  close(mine);  // EOF ends the echo process
  (void)echo->stop(SIGTERM, std::chrono::seconds(5));
  if (!status.ok()) return status;
  return summarize_ns(samples);
}

Result<LatencySummary> spin_pingpong_rtt_us(size_t round_trips, size_t warmup, double max_seconds) noexcept {
  if (round_trips == 0 || !(max_seconds > 0)) {
    return Status(Code::kInvalidArgument, "no round trips or no time");
  }
  void* mem = mmap(nullptr, sizeof(PingPongLine), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) return Status::from_errno("mmap shared line", errno);
  auto* line = new (mem) PingPongLine();
  Result<ChildProcess> peer = fork_child([line] { return answer_pings(*line); });
  Result<LatencySummary> result = Status(Code::kInternal, "not run");
  if (peer.ok()) {
    result = time_pings(*line, round_trips, warmup, static_cast<uint64_t>(max_seconds * 1e9));
    // SYNC POINT WRITE: release; the peer stops at its next load.
    line->seq.store(kStop, std::memory_order_release);
    (void)peer->stop(SIGTERM, std::chrono::seconds(5));
  } else {
    result = peer.status();
  }
  munmap(mem, sizeof(PingPongLine));
  return result;
}

}  // namespace kdn::bench
