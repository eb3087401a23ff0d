// DaemonImpl: kdnd's one class, declared here and defined in rooms by what each part does:
//   daemon.cc             start-up, the metrics it writes, the public Daemon
//   daemon_namespaces.cc  namespaces: open, their tiers in the loop, release, write-down on stop
//   daemon_sessions.cc    admission (accept, pending handshakes, refusals, admit) and sessions ending
//   daemon_schedule.cc    requests: serving a session's ring, parking, slices, retiring, delivery
//   daemon_loop.cc        the event loop: epoll, tier and GPU wake-ups, housekeeping, the stop
// Private to kdn_sidecar_core.
#pragma once

#include <kdn/sidecar/daemon.h>

#include "access.h"
#include "gpu/gpu_service.h"
#include "memory_releaser.h"
#include "metrics.h"
#include "metrics_server.h"
#include "model_table.h"
#include "prefault.h"
#include "request_handler.h"
#include "session.h"

#include <kdn/ipc/handshake.h>
#include <kdn/ipc/uds.h>
#include <unistd.h>

#include <atomic>
#include <deque>
#include <map>
#include <unordered_map>
#include <vector>

namespace kdn::sidecar {
namespace daemon_detail {

// epoll tags: the top byte says what the fd is, the rest identifies it.
enum TagKind : uint64_t {
  kListen = 1,
  kSignal = 2,
  kStop = 3,
  kHandshake = 4,
  kSocket = 5,
  kBell = 6,
  kTierWake = 7,
  kScrape = 8,
  kGpuWake = 9
};
constexpr uint64_t tag(TagKind k, uint64_t id) { return (uint64_t(k) << 56) | (id & ((1ull << 56) - 1)); }
constexpr TagKind tag_kind(uint64_t t) { return TagKind(t >> 56); }
constexpr uint64_t tag_id(uint64_t t) { return t & ((1ull << 56) - 1); }

// A request whose input is larger than this is not run while polling the rings: it waits its
// turn in the runnable queue, so a burst of huge requests costs other sessions one slice, not
// one slice per request.
constexpr uint32_t kInlineInputBytes = 4096;
// Input records of one session's parked requests (and so the memory they may hold).
constexpr uint64_t kMaxRecordsInFlight = 4ull * ipc::kMaxKeysPerOp;
constexpr uint64_t kHousekeepingNs = 50'000'000;

// At most kLines log lines a second; the next line allowed says how many were held back.
class LogLimiter {
 public:
  bool allow(uint64_t now) {
    if (now - window_ns_ >= 1'000'000'000) window_ns_ = now, lines_ = 0;
    if (lines_ < kLines) {
      ++lines_;
      return true;
    }
    ++held_back_;
    return false;
  }
  std::string suppressed_note() {
    if (held_back_ == 0) return "";
    std::string note = " (" + std::to_string(held_back_) + " more not logged)";
    held_back_ = 0;
    return note;
  }

 private:
  static constexpr uint32_t kLines = 5;
  uint64_t window_ns_ = 0;
  uint32_t lines_ = 0;
  uint64_t held_back_ = 0;
};

// A tier fd's epoll id: the namespace's region id, the tier, and which of its fds (its wake fd
// or the descriptor it polls).
enum class TierFd : uint64_t { kWake = 0, kPoll = 1 };
// Requests that still finish after their session closed: a COMMIT and a GPU_STORE settle the
// chunks their copies published (or give back the slots they reserved).
inline bool settles_after_close(const Op& op) {
  const ipc::OpTraits* traits = ipc::op_traits(op.sqe.opcode);
  return traits != nullptr && traits->settles_after_close;
}

constexpr uint64_t wake_id(uint32_t region, TierId tier, TierFd which) {
  return (uint64_t(region) << 3) | (uint64_t(tier_index(tier)) << 1) | uint64_t(which);
}
constexpr uint32_t wake_region(uint64_t id) { return uint32_t(id >> 3); }
constexpr TierId wake_tier(uint64_t id) { return TierId((id >> 1) & 3); }
constexpr TierFd wake_which(uint64_t id) { return TierFd(id & 1); }

}  // namespace daemon_detail

class DaemonImpl {
 public:
  DaemonImpl(Config c, DaemonFaults faults)
      : cfg_(std::move(c)),
        faults_(faults),
        models_(cfg_.max_models_total, cfg_.max_models_per_uid, cfg_.models_reserved_per_namespace),
        handler_(models_, counters_, cfg_) {
    handler_.set_lease_stall(faults_.stall_lease_file, faults_.stall_lease_ms);
    handler_.set_metrics_renderer([this](const Session& s) { return metrics_page_for(s); });
  }

  Status start();
  Status run();
  void request_stop() {
    stop_.store(true, std::memory_order_relaxed);  // only a flag; the eventfd write wakes us
    if (stop_fd_.valid()) {
      const uint64_t one = 1;
      (void)!::write(stop_fd_.get(), &one, sizeof one);
    }
  }

 private:
  struct Pending {
    ipc::UniqueFd sock;
    uint64_t deadline_ns;
    uint32_t uid;
  };

  // ---- the loop
  bool poll_sessions();
  bool serve_session(Session& s);
  bool poll_tiers();
  bool poll_gpu();
  bool run_slice();
  void park(std::unique_ptr<Op> op, Step step);
  // Queues an op for its next slice, unless it is queued already: a sliced request may still
  // wait for transfers whose completions arrive while it waits its turn.
  void make_runnable(Op* op) {
    if (op->queued) return;
    op->queued = true;
    runnable_.push_back(op);
  }
  void retire(Session& s, const Op& op);
  void op_done(Op& op);
  void deliver(Session& s, const ipc::Cqe& c);
  void close_broken();
  bool flush_backlog(Session& s);
  Status service_control(int timeout_ms);
  void sleep_until_work();
  int next_timeout_ms() const;
  void housekeeping(uint64_t now);

  // ---- sessions and namespaces
  bool could_connect(const Peer& peer) const;
  void accept_clients();
  void drop_pending(std::unordered_map<int, Pending>::iterator it);
  bool make_pending_room(uint32_t uid);
  void refuse_at_accept(int fd, pid_t pid, uint32_t uid, Refusal why);
  void finish_handshake(int fd);
  Status admit(ipc::UniqueFd sock, const ipc::ReceivedHello& hello);
  // An arena for `name`, mapped but not pre-faulted (the Prefaulter does that for declared
  // namespaces after kdnd listens).
  Result<Namespace*> open_namespace(const std::string& name, const NamespaceConfig& policy, bool configured);
  // The namespace's tiers' descriptors in the loop's epoll set, or out of it.
  Status poll_tiers_of(const Namespace& ns);
  void unpoll_tiers_of(const Namespace& ns);
  void write_down_on_stop();
  void write_down(const std::string& name, Namespace& ns, Tier& target);
  void release_namespaces(uint64_t now);
  void close_session(Session* s, const char* why);
  void destroy_session(Session* s);
  void release_session_memory(Session& s);
  Status staging_budget_allows(const Namespace& ns, uint32_t uid, uint64_t bytes) const;
  void write_metrics();
  std::vector<NamespaceMetrics> metrics_namespaces() const;
  std::string metrics_page_for(const Session& s) const;

  Config cfg_;
  DaemonFaults faults_;
  ipc::UniqueFd listen_, signal_fd_, stop_fd_;
  ipc::EventPoller poller_;
  std::map<std::string, std::unique_ptr<Namespace>> namespaces_;
  // The GPU tier; destroyed before the namespaces whose arenas it page-locked.
  std::unique_ptr<gpu::GpuService> gpu_;
  std::vector<gpu::GpuService::Woken> gpu_woken_;
  std::unordered_map<std::string, std::pair<uint32_t, uint32_t>> regions_;  // namespace -> arena region id, generation
  uint32_t next_region_ = 1;
  std::unordered_map<uint64_t, std::unique_ptr<Session>> sessions_;
  std::vector<Session*> active_;  // open sessions, polled
  size_t rr_ = 0;                 // where the next poll pass starts
  std::unordered_map<int, Pending> pending_;
  std::unordered_map<uint32_t, uint32_t> pending_per_uid_;
  std::unordered_map<uint32_t, uint64_t> staging_per_uid_;  // staging bytes of each uid's sessions
  MemoryReleaser releaser_;                                 // unmaps what ended sessions leave behind, off the loop
  daemon_detail::LogLimiter refusal_log_;                   // refusals can come by the thousand: a few lines a second
  std::string metrics_error_;                               // the last failure to write the metrics file ("" = none)
  std::unordered_map<uint64_t, std::unique_ptr<Op>> ops_;   // parked requests by token
  std::deque<Op*> runnable_;
  std::vector<Session*> broken_;  // sessions whose completion ring broke, closed next turn
  std::vector<StoreEvent> events_ = std::vector<StoreEvent>(256);
  ModelTable models_;
  DaemonCounters counters_;
  RequestHandler handler_;
  uint64_t next_session_id_ = 1;
  uint64_t next_token_ = 1;
  uint64_t last_metrics_ns_ = 0, last_housekeeping_ns_ = 0;
  std::atomic<bool> stop_{false};
  std::unique_ptr<MetricsServer> metrics_server_;  // metrics_listen; its thread reads nothing of ours
  Prefaulter prefaulter_;                          // last: stopped before the namespaces it faults in are unmapped
};

}  // namespace kdn::sidecar
