// Wakeups between a client and kdnd, so that an idle daemon and an idle client cost ~0% CPU
// and a busy pair never enters the kernel.
//
// Client -> daemon (submissions), io_uring SQPOLL style:
//   daemon, before sleeping:  need_wakeup = 1 in every session;  seq_cst fence;
//                             re-check every SQ (non-empty -> need_wakeup = 0, keep working);
//                             epoll_wait on the sessions' doorbell eventfds;
//                             after waking: need_wakeup = 0 everywhere, drain the eventfds.
//   client, after publishing: seq_cst fence;  if need_wakeup: write the eventfd.
// The two fences order "store flag, load tail" against "store tail, load flag": at least
// one side sees the other's store, so a submission is never stranded while the daemon
// sleeps (no lost wakeup).
//
// Daemon -> client (completions):
//   client waiting: spin up to spin_ns polling the CQ tail; then cq_waiting = 1; seq_cst
//                   fence; re-check the tail; futex_wait(CQ tail word, seen value, timeout);
//                   finally cq_waiting = 0.
//   daemon, after publishing a CQE: seq_cst fence; if cq_waiting: futex_wake(CQ tail word).
// The futex is shared (not FUTEX_PRIVATE): the word lives in a MAP_SHARED memfd mapping and
// the kernel keys it by the underlying page, so the two processes' different virtual
// addresses meet. futex_wait re-checks the word atomically, closing the last race.
//
// Thread safety: the free functions are thread-safe; an EventDoorbell, EventPoller or
// CompletionWaiter is used by one thread at a time.
#pragma once

#include <kdn/common/status.h>
#include <kdn/ipc/fd.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>

namespace kdn::ipc {

// ---- futex on a shared u32 word --------------------------------------------------------------
// Sleeps while *word == expected, at most timeout_ns (UINT64_MAX = no limit). Returns OK on a
// wakeup, a spurious wakeup, EINTR, or when *word != expected already (EAGAIN): the caller
// re-checks its condition. KDN_ERR_TIMEOUT when the time ran out.
Status futex_wait(const uint32_t* word, uint32_t expected, uint64_t timeout_ns) noexcept;
// Wakes up to `count` waiters on word; returns how many were woken.
Result<int> futex_wake(const uint32_t* word, int count) noexcept;

// ---- the need_wakeup / cq_waiting flags (words in the SessionHeader) ---------------------------
// Client, right after publishing SQEs: rings `bell` iff the daemon announced it sleeps.
class EventDoorbell;
Status kick_if_sleeping(uint32_t* need_wakeup, const EventDoorbell& bell) noexcept;
// Daemon: announce (true) / withdraw (false) sleeping on one session. After announcing on
// every session, call sleep_fence() once, then re-check every SQ before epoll_wait.
void set_need_wakeup(uint32_t* need_wakeup, bool sleeping) noexcept;
void sleep_fence() noexcept;
// Daemon, right after publishing CQEs: futex-wakes the client iff it announced waiting.
Status wake_if_waiting(uint32_t* cq_waiting, const uint32_t* cq_tail) noexcept;

// ---- eventfd doorbell ------------------------------------------------------------------------------
// Owns one eventfd (non-blocking, close-on-exec). The daemon creates it and passes it to the
// client; the client rings, the daemon's EventPoller waits on it and drains it.
class EventDoorbell {
 public:
  EventDoorbell() noexcept = default;
  static Result<EventDoorbell> create() noexcept;
  // Takes a received eventfd; KDN_ERR_PROTOCOL if fd is not an eventfd.
  static Result<EventDoorbell> adopt(UniqueFd fd) noexcept;

  // Adds 1 to the counter. A saturated counter (EAGAIN) is still "rung": OK.
  Status ring() const noexcept;
  // Reads and resets the counter; 0 if it was not rung.
  Result<uint64_t> drain() const noexcept;

  int fd() const noexcept { return fd_.get(); }
  bool valid() const noexcept { return fd_.valid(); }

 private:
  explicit EventDoorbell(UniqueFd fd) noexcept : fd_(std::move(fd)) {}
  UniqueFd fd_;
};

// epoll over doorbells (and any other fds, e.g. session sockets for hang-up): the daemon's
// sleep. Each fd is registered with a caller-chosen 64-bit tag that wait() reports back.
class EventPoller {
 public:
  EventPoller() noexcept = default;
  static Result<EventPoller> create() noexcept;

  // Watches fd for readability and hang-up (EPOLLIN | EPOLLRDHUP). The fd must outlive its
  // registration; remove it before closing it.
  Status add(int fd, uint64_t tag) noexcept;
  Status remove(int fd) noexcept;
  // Waits up to timeout_ms (-1 = forever) and writes the tags of ready fds into `tags`.
  // Returns how many (0 on timeout or EINTR).
  Result<size_t> wait(std::span<uint64_t> tags, int timeout_ms) noexcept;

  int fd() const noexcept { return epoll_.get(); }

 private:
  explicit EventPoller(UniqueFd fd) noexcept : epoll_(std::move(fd)) {}
  UniqueFd epoll_;
};

// ---- client: wait for the CQ tail to move ----------------------------------------------------------
constexpr uint64_t kDefaultSpinNs = 30'000;

class CompletionWaiter {
 public:
  CompletionWaiter() noexcept = default;
  // cq_tail: the daemon-published CQ tail word; cq_waiting: the SessionHeader word. Both
  // must stay mapped while the waiter is used.
  CompletionWaiter(const uint32_t* cq_tail, uint32_t* cq_waiting, uint64_t spin_ns = kDefaultSpinNs) noexcept
      : cq_tail_(cq_tail), cq_waiting_(cq_waiting), spin_ns_(spin_ns) {}

  // Returns OK once the CQ tail differs from `seen_tail` (something new may be there),
  // KDN_ERR_TIMEOUT after timeout_ns. Spins first, then sleeps in the kernel.
  Status wait(uint32_t seen_tail, uint64_t timeout_ns) const noexcept;

  uint64_t spin_ns() const noexcept { return spin_ns_; }

 private:
  bool tail_moved(uint32_t seen_tail) const noexcept;
  Status sleep_until_moved(uint32_t seen_tail, uint64_t deadline_ns) const noexcept;

  const uint32_t* cq_tail_ = nullptr;
  uint32_t* cq_waiting_ = nullptr;
  uint64_t spin_ns_ = kDefaultSpinNs;
};

}  // namespace kdn::ipc
