#include <kdn/ipc/doorbell.h>

#include <kdn/common/clock.h>

#include <linux/futex.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <utility>

namespace kdn::ipc {
namespace {

// atomic_ref needs a non-const object; the shared words are writable memory, we only load.
uint32_t load_relaxed(const uint32_t* word) noexcept {
  return std::atomic_ref<uint32_t>(*const_cast<uint32_t*>(word)).load(std::memory_order_relaxed);
}

timespec to_timespec(uint64_t ns) noexcept {
  timespec ts;
  ts.tv_sec = static_cast<time_t>(ns / 1'000'000'000ull);
  ts.tv_nsec = static_cast<long>(ns % 1'000'000'000ull);
  return ts;
}

bool is_eventfd(int fd) noexcept {
  char link[64];
  char target[64];
  std::snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
  ssize_t n = ::readlink(link, target, sizeof(target) - 1);
  if (n < 0) return false;
  target[n] = '\0';
  return std::strcmp(target, "anon_inode:[eventfd]") == 0;
}

}  // namespace

// ---- futex -------------------------------------------------------------------------------------
Status futex_wait(const uint32_t* word, uint32_t expected, uint64_t timeout_ns) noexcept {
  timespec ts = to_timespec(timeout_ns);
  const timespec* timeout = timeout_ns == UINT64_MAX ? nullptr : &ts;
  // FUTEX_WAIT (not FUTEX_WAIT_PRIVATE): the word is in a MAP_SHARED mapping used by two
  // processes. The timeout is relative, measured on CLOCK_MONOTONIC.
  long rc = ::syscall(SYS_futex, word, FUTEX_WAIT, expected, timeout, nullptr, 0);
  if (rc == 0) return OkStatus();
  int err = errno;
  if (err == EAGAIN || err == EINTR) return OkStatus();  // value changed or signal: re-check
  if (err == ETIMEDOUT) return Status(Code::kTimeout, "futex wait timed out");
  return Status::from_errno("futex wait", err);
}

Result<int> futex_wake(const uint32_t* word, int count) noexcept {
  long rc = ::syscall(SYS_futex, word, FUTEX_WAKE, count, nullptr, nullptr, 0);
  if (rc < 0) return Status::from_errno("futex wake", errno);
  return static_cast<int>(rc);
}

// ---- flags -------------------------------------------------------------------------------------
Status kick_if_sleeping(uint32_t* need_wakeup, const EventDoorbell& bell) noexcept {
  // SYNC POINT: seq_cst fence between our release store of the SQ tail and the load of
  // need_wakeup; pairs with the daemon's sleep_fence() between its store of need_wakeup and
  // its re-check of the SQ tail. One of the two always sees the other's store.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  // relaxed: ordered by the fence above.
  if (std::atomic_ref<uint32_t>(*need_wakeup).load(std::memory_order_relaxed) == 0) return OkStatus();
  return bell.ring();
}

void set_need_wakeup(uint32_t* need_wakeup, bool sleeping) noexcept {
  // relaxed: sleep_fence() orders the announcement before the daemon's re-check; clearing
  // it needs no order (a stale 1 only costs the client one spare eventfd write).
  std::atomic_ref<uint32_t>(*need_wakeup).store(sleeping ? 1u : 0u, std::memory_order_relaxed);
}

void sleep_fence() noexcept {
  // SYNC POINT: pairs with the fence in kick_if_sleeping (see there).
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

Status wake_if_waiting(uint32_t* cq_waiting, const uint32_t* cq_tail) noexcept {
  // SYNC POINT: seq_cst fence between our release store of the CQ tail and the load of
  // cq_waiting; pairs with the client's fence between its store of cq_waiting and its
  // re-check of the CQ tail (CompletionWaiter::sleep_until_moved).
  std::atomic_thread_fence(std::memory_order_seq_cst);
  // relaxed: ordered by the fence above.
  if (std::atomic_ref<uint32_t>(*cq_waiting).load(std::memory_order_relaxed) == 0) return OkStatus();
  Result<int> woken = futex_wake(cq_tail, INT_MAX);
  return woken.ok() ? OkStatus() : woken.status();
}

// ---- EventDoorbell -----------------------------------------------------------------------------
Result<EventDoorbell> EventDoorbell::create() noexcept {
  int fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (fd < 0) return Status::from_errno("eventfd", errno);
  return EventDoorbell(UniqueFd(fd));
}

Result<EventDoorbell> EventDoorbell::adopt(UniqueFd fd) noexcept {
  if (!fd.valid() || !is_eventfd(fd.get())) return Status(Code::kProtocol, "doorbell fd is not an eventfd");
  return EventDoorbell(std::move(fd));
}

Status EventDoorbell::ring() const noexcept {
  const uint64_t one = 1;
  for (;;) {
    ssize_t n = ::write(fd_.get(), &one, sizeof(one));
    if (n == sizeof(one)) return OkStatus();
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return OkStatus();  // counter saturated: already rung
    return Status::from_errno("eventfd write", n < 0 ? errno : EIO);
  }
}

Result<uint64_t> EventDoorbell::drain() const noexcept {
  uint64_t count = 0;
  for (;;) {
    ssize_t n = ::read(fd_.get(), &count, sizeof(count));
    if (n == sizeof(count)) return count;
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return uint64_t{0};
    return Status::from_errno("eventfd read", n < 0 ? errno : EIO);
  }
}

// ---- EventPoller -------------------------------------------------------------------------------
Result<EventPoller> EventPoller::create() noexcept {
  int fd = ::epoll_create1(EPOLL_CLOEXEC);
  if (fd < 0) return Status::from_errno("epoll_create1", errno);
  return EventPoller(UniqueFd(fd));
}

Status EventPoller::add(int fd, uint64_t tag) noexcept {
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP;
  ev.data.u64 = tag;
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) return Status::from_errno("epoll add", errno);
  return OkStatus();
}

Status EventPoller::remove(int fd) noexcept {
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, fd, nullptr) != 0) {
    return Status::from_errno("epoll del", errno);
  }
  return OkStatus();
}

Result<size_t> EventPoller::wait(std::span<uint64_t> tags, int timeout_ms) noexcept {
  constexpr size_t kBatch = 64;
  epoll_event events[kBatch];
  int max = static_cast<int>(std::min(tags.size(), kBatch));
  if (max == 0) return Status(Code::kInvalidArgument, "no room for ready tags");
  int n = ::epoll_wait(epoll_.get(), events, max, timeout_ms);
  if (n < 0 && errno == EINTR) return size_t{0};
  if (n < 0) return Status::from_errno("epoll_wait", errno);
  for (int i = 0; i < n; ++i) tags[static_cast<size_t>(i)] = events[i].data.u64;
  return static_cast<size_t>(n);
}

// ---- CompletionWaiter --------------------------------------------------------------------------
bool CompletionWaiter::tail_moved(uint32_t seen_tail) const noexcept {
  // relaxed: only a hint that something arrived; the ring's own acquire load of the tail
  // orders the entry bytes when the caller pops.
  return load_relaxed(cq_tail_) != seen_tail;
}

Status CompletionWaiter::wait(uint32_t seen_tail, uint64_t timeout_ns) const noexcept {
  uint64_t start = now_ns();
  uint64_t deadline = timeout_ns > UINT64_MAX - start ? UINT64_MAX : start + timeout_ns;
  uint64_t spin_until = start + std::min(spin_ns_, timeout_ns);
  while (!tail_moved(seen_tail)) {
    if (now_ns() >= spin_until) return sleep_until_moved(seen_tail, deadline);
    cpu_relax();
  }
  return OkStatus();
}

Status CompletionWaiter::sleep_until_moved(uint32_t seen_tail, uint64_t deadline_ns) const noexcept {
  // relaxed store + seq_cst fence: SYNC POINT paired with the fence in wake_if_waiting.
  std::atomic_ref<uint32_t>(*cq_waiting_).store(1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  Status result = OkStatus();
  while (!tail_moved(seen_tail)) {
    uint64_t now = now_ns();
    if (now >= deadline_ns) {
      result = Status(Code::kTimeout, "no completion in time");
      break;
    }
    uint64_t left = deadline_ns == UINT64_MAX ? UINT64_MAX : deadline_ns - now;
    Status s = futex_wait(cq_tail_, seen_tail, left);
    if (!s.ok() && s.code() != Code::kTimeout) {
      result = s;
      break;
    }
  }
  // relaxed: clearing only saves the daemon a futex_wake; a stale 1 is harmless.
  std::atomic_ref<uint32_t>(*cq_waiting_).store(0, std::memory_order_relaxed);
  return result;
}

}  // namespace kdn::ipc
