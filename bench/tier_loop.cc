#include "tier_loop.h"

#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>

namespace kdn::bench {

using sidecar::RedisClock;
using sidecar::TierCompletion;
using sidecar::Transfer;

TierLoop::TierLoop(sidecar::RemoteTier& tier) : tier_(tier), epoll_fd_(::epoll_create1(EPOLL_CLOEXEC)) {
  for (int fd : {tier.poll_fd(), tier.wake_fd()}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    (void)::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
  }
}

TierLoop::~TierLoop() {
  if (epoll_fd_ >= 0) ::close(epoll_fd_);
}

void TierLoop::turn(std::vector<TierCompletion>& out) {
  TierCompletion c[64];
  size_t n = tier_.reap(c);
  if (n == 0) {
    const auto now = RedisClock::now();
    const auto wait = std::min<RedisClock::duration>(tier_.next_deadline() - now, std::chrono::milliseconds(50));
    const int ms = int(std::max<int64_t>(0, std::chrono::ceil<std::chrono::milliseconds>(wait).count()));
    epoll_event ev[4];
    (void)::epoll_wait(epoll_fd_, ev, 4, ms);
    tier_.service(RedisClock::now());
    n = tier_.reap(c);
  }
  out.insert(out.end(), c, c + n);
}

Status TierLoop::transfer_all(size_t count, uint32_t depth, const std::function<Transfer(size_t)>& make,
                              const std::function<void(size_t, const Status&)>& done, std::chrono::milliseconds stall) {
  size_t next = 0, finished = 0, in_flight = 0;
  std::vector<TierCompletion> completions;
  auto last_progress = RedisClock::now();
  while (finished < count) {
    for (; next < count && in_flight < depth; ++next) {
      Transfer t = make(next);
      t.id = next;
      if (Status st = tier_.submit(t); !st.ok()) {
        done(next, st);
        ++finished;
        continue;
      }
      ++in_flight;
    }
    completions.clear();
    turn(completions);
    for (const TierCompletion& c : completions) {
      done(size_t(c.id), c.status);
      --in_flight;
      ++finished;
    }
    const auto now = RedisClock::now();
    if (!completions.empty()) last_progress = now;
    if (in_flight > 0 && now - last_progress > stall) return Status(Code::kTimeout, "no transfer completed in time");
  }
  return OkStatus();
}

Status TierLoop::probe(std::span<const sidecar::ChunkIdentity> chunks, std::vector<uint8_t>* exists,
                       std::chrono::milliseconds limit) {
  const sidecar::TransferId id = next_probe_id_++;
  if (Status st = tier_.probe(id, chunks, exists); !st.ok()) return st;
  const auto until = RedisClock::now() + limit;
  std::vector<TierCompletion> completions;
  while (RedisClock::now() < until) {
    completions.clear();
    turn(completions);
    for (const TierCompletion& c : completions) {
      if (c.id == id) return c.status;
    }
  }
  return Status(Code::kTimeout, "the probe did not complete in time");
}

}  // namespace kdn::bench
