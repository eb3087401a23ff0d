// The event loop: sessions polled, then parked slices, tier and GPU wake-ups, housekeeping and
// the control fds (listen, signals, stop, handshakes, doorbells), sleeping only when no work is left.
#include "daemon_impl.h"

#include <kdn/common/clock.h>
#include <kdn/ipc/doorbell.h>
#include <poll.h>
#include <spdlog/fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <sys/signalfd.h>

namespace kdn::sidecar {
using namespace daemon_detail;

bool DaemonImpl::poll_gpu() {
  if (!gpu_ || !gpu_->enabled()) return false;
  gpu_woken_.clear();
  gpu_->poll(&gpu_woken_);
  for (const gpu::GpuService::Woken& w : gpu_woken_) {
    auto it = ops_.find(w.op_token);
    if (it == ops_.end()) {
      (void)gpu_->take_blend(w.op_token);  // nobody waits for its answer any more
      continue;
    }
    Op& op = *it->second;
    handler_.on_gpu_done(op, w.failed);
    if (op.waiting == 0) make_runnable(&op);
  }
  return !gpu_woken_.empty();
}

// Applies every tier's completions and wakes the requests that waited for them.
bool DaemonImpl::poll_tiers() {
  bool any = gpu_ && gpu_->busy() ? poll_gpu() : false;
  for (auto& [name, ns] : namespaces_) {
    // Work of the tiers nobody waits for (background writes, sockets, timers) moves on here;
    // transfers are reaped by the store below.
    const bool store_idle = ns->store->transfers_in_flight() == 0;
    ns->for_each_lower([&](Tier& t) { any |= t.advance(store_idle); });
    if (ns->store->transfers_in_flight() == 0) continue;
    events_.clear();
    bool room = false;
    if (ns->store->poll(events_, &room) == 0) continue;
    any = true;
    const std::string& ns_name = ns->name;  // (a lambda may not capture a structured binding in clang 14)
    ns->for_each_lower([&](Tier& t) { t.log_new_faults(ns_name); });  // as they happen, once per cause
    for (const StoreEvent& ev : events_) {
      auto it = ops_.find(ev.waiter);
      if (it == ops_.end()) continue;  // the request ended meanwhile
      Op& op = *it->second;
      if (op.waiting == 0) continue;
      handler_.on_event(op, ev);
      if (op.waiting == 0) make_runnable(&op);
    }
    if (room) {
      for (auto& [token, op] : ops_) {
        if (op->wants_room && op->session->ns == ns.get()) {
          op->wants_room = false;
          make_runnable(op.get());
        }
      }
    }
  }
  return any;
}

void DaemonImpl::housekeeping(uint64_t now) {
  last_housekeeping_ns_ = now;
  for (Session* s : active_) {
    if (!s->reservations.empty()) handler_.expire_reservations(*s, now);
  }
  for (auto& [token, op] : ops_) {
    if (op->wants_room && now >= op->room_deadline_ns) {
      op->wants_room = false;
      make_runnable(op.get());
    }
  }
  for (auto& [name, ns] : namespaces_) {
    ns->for_each_lower([&](Tier& t) { t.housekeeping(now); });
  }
  release_namespaces(now);
}

// ---- the loop -----------------------------------------------------------------------------------

int DaemonImpl::next_timeout_ms() const {
  int t = -1;
  auto at_most = [&](int ms) { t = t < 0 ? ms : std::min(t, ms); };
  if (!cfg_.metrics_file.empty()) at_most(1000);
  bool timed = !ops_.empty();
  for (auto& [name, ns] : namespaces_) {
    timed |= !ns->configured && ns->sessions == 0;
    ns->for_each_lower([&](const Tier& t) { timed |= t.wants_housekeeping(); });
  }
  for (const Session* s : active_) timed |= !s->reservations.empty();
  if (timed) at_most(int(kHousekeepingNs / 1000000));
  const uint64_t now = now_ns();
  for (auto& [fd, p] : pending_) at_most(p.deadline_ns > now ? int((p.deadline_ns - now) / 1000000) + 1 : 0);
  // The tiers' own deadlines (request timeouts, reconnect backoff, slot map refreshes).
  for (auto& [name, ns] : namespaces_) {
    ns->for_each_lower([&](const Tier& tier) {
      const uint64_t next = tier.next_deadline_ns();
      if (next == UINT64_MAX) return;
      at_most(next <= now ? 0 : int(std::min<uint64_t>((next - now) / 1'000'000, INT32_MAX - 1)) + 1);
    });
  }
  return t;
}

Status DaemonImpl::service_control(int timeout_ms) {
  uint64_t tags[64];
  auto n = poller_.wait(tags, timeout_ms);
  if (!n.ok()) return n.status();
  for (size_t i = 0; i < *n; ++i) {
    const uint64_t id = tag_id(tags[i]);
    switch (tag_kind(tags[i])) {
      case kListen:
        accept_clients();
        break;
      case kHandshake:
        finish_handshake(int(id));
        break;
      case kSignal: {
        signalfd_siginfo si;
        while (::read(signal_fd_.get(), &si, sizeof si) == sizeof si) {
          spdlog::info("signal {}: shutting down", si.ssi_signo);
          stop_.store(true, std::memory_order_relaxed);
        }
        break;
      }
      case kStop:
        stop_.store(true, std::memory_order_relaxed);
        break;
      case kGpuWake:
        (void)poll_gpu();
        break;  // drains the queue's eventfd
      case kScrape:
        if (!metrics_server_->consume_request()) break;
        try {
          metrics_server_->publish(prometheus_text(&counters_, metrics_namespaces(), gpu_.get()));
        } catch (const std::bad_alloc&) {
          spdlog::warn("out of memory rendering metrics for a scrape");  // it gets 503 on its timeout
        }
        break;
      case kSocket: {
        auto it = sessions_.find(id);
        if (it != sessions_.end()) close_session(it->second.get(), "client hung up");
        break;
      }
      case kBell: {
        auto it = sessions_.find(id);
        if (it != sessions_.end() && !it->second->closed) (void)it->second->shm.doorbell().drain();
        break;
      }
      case kTierWake: {
        // Drained here, reaped by poll_tiers() on the next turn: a completion can be reaped
        // together with an earlier one and leave the eventfd readable with nothing to reap,
        // which would otherwise wake every epoll_wait at once (an idle daemon at 100% CPU).
        for (auto& [name, ns] : namespaces_) {
          if (ns->region_id != wake_region(id)) continue;
          Tier* tier = ns->tier(wake_tier(id));
          if (tier == nullptr) continue;
          if (wake_which(id) == TierFd::kPoll) {
            tier->on_poll_fd();  // sockets: its completions follow on its wake fd
            continue;
          }
          uint64_t count;
          if (tier->wake_fd() >= 0) (void)!::read(tier->wake_fd(), &count, sizeof count);
        }
        break;
      }
    }
  }
  if (!pending_.empty()) {
    const uint64_t now = now_ns();
    for (auto it = pending_.begin(); it != pending_.end();) {
      auto next = std::next(it);
      if (it->second.deadline_ns <= now) {
        drop_pending(it);  // closes the socket: a client that never says hello is cut off
        counters_.refuse(Refusal::kTimeout);
      }
      it = next;
    }
  }
  const uint64_t now = now_ns();
  if (now - last_housekeeping_ns_ >= kHousekeepingNs) housekeeping(now);
  if (!cfg_.metrics_file.empty() && now - last_metrics_ns_ >= 1000000000ull) write_metrics();
  return OkStatus();
}

void DaemonImpl::sleep_until_work() {
  for (Session* s : active_) s->shm.set_sleeping(true);
  ipc::sleep_fence();  // SYNC POINT: need_wakeup stores before the ring re-check below
  bool work = !runnable_.empty();
  for (Session* s : active_) {
    auto p = s->shm.pending();
    work |= !p.ok() || *p > 0;
  }
  if (!work) {
    Status st = service_control(next_timeout_ms());
    if (!st.ok()) spdlog::error("epoll: {}", st.what());
  }
  for (Session* s : active_) s->shm.set_sleeping(false);
}

Status DaemonImpl::run() {
  const uint64_t spin_ns = uint64_t(cfg_.spin_us) * 1000;
  uint64_t last_busy = now_ns();
  uint32_t iter = 0;
  while (!stop_.load(std::memory_order_relaxed)) {
    bool busy = false;
    try {
      if (!broken_.empty()) close_broken();
      busy = poll_tiers();
      busy |= poll_sessions();
      busy |= run_slice();
    } catch (const std::bad_alloc&) {
      // Requests catch their own; this is the loop's bookkeeping (a queue, an event list).
      // kdnd keeps running: it retries on the next turn rather than dying with every session.
      spdlog::error("out of memory in the event loop; retrying");
      busy = true;
    }
    if (busy) {
      last_busy = now_ns();
      if (++iter % 256 == 0) KDN_RETURN_IF_ERROR(service_control(0));
      continue;
    }
    if (now_ns() - last_busy < spin_ns) {
      cpu_relax();
      if (++iter % 64 == 0) KDN_RETURN_IF_ERROR(service_control(0));
      continue;
    }
    sleep_until_work();
    last_busy = now_ns();
  }
  close_broken();
  spdlog::info("closing {} sessions", active_.size());
  while (!active_.empty()) close_session(active_.back(), "daemon shutting down");
  // Copies still in flight read staging areas: let them land before anything is unmapped.
  while (!ops_.empty()) {
    (void)poll_tiers();
    (void)run_slice();
  }
  // GPU batches read arenas and engine memory: they land before either goes.
  if (gpu_) gpu_->stop_encoding();  // T0 encodes not started yet are not worth the wait
  while (gpu_ && gpu_->busy()) {
    (void)poll_gpu();
    if (gpu_->busy()) (void)::poll(nullptr, 0, 1);
  }
  write_down_on_stop();
  listen_.reset();
  ::unlink(cfg_.socket_path.c_str());
  return OkStatus();
}

// SIGTERM: chunks held only in the arena are written down to the tier a restart rebuilds the

}  // namespace kdn::sidecar
