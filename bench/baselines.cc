// memcpy, Unix-socket echo and spin ping-pong baselines (redis lives in redis_baseline.cc).
#include "baselines.h"

#include "page_buffer.h"
#include "process.h"

#include <kdn/common/clock.h>

#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cerrno>
#include <cstring>
#include <thread>
#include <vector>

namespace kdn::bench {
namespace {

// ---- memcpy ------------------------------------------------------------------------------

struct CopyLane {
  PageBuffer src, dst;
  std::vector<uint64_t> start_ns, end_ns;  // one per repetition
};

// One thread's part: first-touch its buffers (so they sit near the core that copies), then
// copy once per repetition between the shared barriers.
void run_copy_lane(CopyLane& lane, int repetitions, std::barrier<>& sync, uint64_t seed) {
  lane.src.fill_pattern(seed);
  std::memset(lane.dst.data(), 0, lane.dst.size());
  for (int rep = 0; rep < repetitions; ++rep) {
    sync.arrive_and_wait();
    lane.start_ns[rep] = now_ns();
    std::memcpy(lane.dst.data(), lane.src.data(), lane.src.size());
    lane.end_ns[rep] = now_ns();
    sync.arrive_and_wait();
  }
}

// Wall time of repetition `rep`: from the earliest start to the latest end over all lanes.
uint64_t repetition_wall_ns(const std::vector<CopyLane>& lanes, int rep) {
  uint64_t first = UINT64_MAX, last = 0;
  for (const CopyLane& lane : lanes) {
    first = std::min(first, lane.start_ns[rep]);
    last = std::max(last, lane.end_ns[rep]);
  }
  return last - first;
}

Result<std::vector<CopyLane>> allocate_lanes(unsigned threads, size_t bytes, int repetitions) {
  std::vector<CopyLane> lanes(threads);
  for (CopyLane& lane : lanes) {
    Result<PageBuffer> src = PageBuffer::allocate(bytes, /*prefault=*/false);
    if (!src.ok()) return src.status();
    Result<PageBuffer> dst = PageBuffer::allocate(bytes, /*prefault=*/false);
    if (!dst.ok()) return dst.status();
    lane.src = std::move(src).value();
    lane.dst = std::move(dst).value();
    lane.start_ns.assign(static_cast<size_t>(repetitions), 0);
    lane.end_ns.assign(static_cast<size_t>(repetitions), 0);
  }
  return lanes;
}

Status run_lanes(std::vector<CopyLane>& lanes, int repetitions) {
  std::barrier<> sync(static_cast<std::ptrdiff_t>(lanes.size()));
  std::vector<std::thread> workers;
  Status status;
  for (size_t i = 0; i < lanes.size(); ++i) {
    try {
      workers.emplace_back(run_copy_lane, std::ref(lanes[i]), repetitions, std::ref(sync), i + 1);
    } catch (const std::system_error&) {
      // Lanes that never started must not leave the started ones waiting at the barrier.
      for (size_t missing = i; missing < lanes.size(); ++missing) sync.arrive_and_drop();
      status = Status(Code::kNoMemory, "cannot start memcpy thread");
      break;
    }
  }
  for (std::thread& t : workers) t.join();
  return status;
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

Result<LatencySummary> time_pings(PingPongLine& line, size_t round_trips, size_t warmup,
                                  uint64_t budget_ns) {
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

Result<MemcpyResult> memcpy_gbps(unsigned threads, size_t bytes_per_thread,
                                 int repetitions) noexcept {
  if (threads == 0 || bytes_per_thread == 0 || repetitions <= 0) {
    return Status(Code::kInvalidArgument, "memcpy baseline needs threads, bytes, repetitions");
  }
  Result<std::vector<CopyLane>> lanes = allocate_lanes(threads, bytes_per_thread, repetitions);
  if (!lanes.ok()) return lanes.status();
  KDN_RETURN_IF_ERROR(run_lanes(*lanes, repetitions));
  for (const CopyLane& lane : *lanes) {
    if (std::memcmp(lane.src.data(), lane.dst.data(), lane.src.size()) != 0) {
      return Status(Code::kInternal, "memcpy baseline: destination differs from source");
    }
  }
  std::vector<double> rates;
  for (int rep = 0; rep < repetitions; ++rep) {
    uint64_t bytes = static_cast<uint64_t>(threads) * bytes_per_thread;
    rates.push_back(gb_per_s(bytes, repetition_wall_ns(*lanes, rep)));
  }
  MemcpyResult r;
  r.median_gbps = median(rates);
  r.best_gbps = *std::max_element(rates.begin(), rates.end());
  r.threads = threads;
  r.bytes_per_thread = bytes_per_thread;
  r.repetitions = repetitions;
  return r;
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

Result<LatencySummary> spin_pingpong_rtt_us(size_t round_trips, size_t warmup,
                                            double max_seconds) noexcept {
  if (round_trips == 0 || !(max_seconds > 0)) {
    return Status(Code::kInvalidArgument, "no round trips or no time");
  }
  void* mem = mmap(nullptr, sizeof(PingPongLine), PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
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
