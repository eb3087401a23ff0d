#include <kdn/sidecar/daemon.h>

#include "access.h"
#include "admission.h"
#include "gpu/gpu_service.h"
#include "memory_releaser.h"
#include "metrics.h"
#include "metrics_server.h"
#include "prefault.h"
#include "request_handler.h"
#include "session.h"
#include "tier_factory.h"

#include <kdn/common/clock.h>
#include <kdn/common/files.h>
#include <kdn/ipc/doorbell.h>
#include <kdn/ipc/handshake.h>
#include <kdn/ipc/uds.h>

#include <malloc.h>
#include <poll.h>
#include <spdlog/fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <csignal>
#include <map>
#include <unordered_map>
#include <vector>

namespace kdn::sidecar {
namespace {

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

// The socket's modes: private to kdnd's uid unless the configuration lets other uids or
// groups connect, when others may enter the directory (not list or write it) and connect.
ipc::ListenOptions listen_options(const Config& c) {
  const uint32_t self = ::geteuid();
  bool others = false;
  for (const NamespaceConfig& ns : c.namespaces) {
    others |= !ns.allow_gids.empty();
    for (uint32_t uid : ns.allow_uids) others |= uid != self;
  }
  if (c.allow_create_namespaces)
    for (uint32_t uid : c.create_namespace_uids) others |= uid != self && uid != 0;
  ipc::ListenOptions o;
  o.backlog = 256;
  o.dir_mode = others ? 0711 : 0700;
  o.socket_mode = others ? 0666 : 0600;
  return o;
}
// A tier fd's epoll id: the namespace's region id, the tier, and which of its fds (its wake fd
// or the descriptor it polls).
enum class TierFd : uint64_t { kWake = 0, kPoll = 1 };
// Requests that still finish after their session closed: a COMMIT and a GPU_STORE settle the
// chunks their copies published (or give back the slots they reserved).
bool settles_after_close(const Op& op) {
  const ipc::OpTraits* traits = ipc::op_traits(op.sqe.opcode);
  return traits != nullptr && traits->settles_after_close;
}

constexpr uint64_t wake_id(uint32_t region, TierId tier, TierFd which) {
  return (uint64_t(region) << 3) | (uint64_t(tier_index(tier)) << 1) | uint64_t(which);
}
constexpr uint32_t wake_region(uint64_t id) { return uint32_t(id >> 3); }
constexpr TierId wake_tier(uint64_t id) { return TierId((id >> 1) & 3); }
constexpr TierFd wake_which(uint64_t id) { return TierFd(id & 1); }

}  // namespace

// Sessions that held this many leased chunks or more have the heap trimmed after they end.
constexpr size_t kManyLeases = 4096;

// Dropped on the MemoryReleaser's thread: returns the heap's free memory to the kernel then.
struct HeapTrim {
  ~HeapTrim() { ::malloc_trim(0); }
};

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
  LogLimiter refusal_log_;                                  // refusals can come by the thousand: a few lines a second
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

// ---- start-up ---------------------------------------------------------------------------------

Status DaemonImpl::start() {
  std::string error;
  Status valid = cfg_.validate(&error);
  if (!valid.ok()) {
    spdlog::error("{}", error.empty() ? valid.what() : error);
    return valid;
  }
  auto poller = ipc::EventPoller::create();
  if (!poller.ok()) return poller.status();
  poller_ = std::move(*poller);

  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGINT);
  sigaddset(&mask, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &mask, nullptr);
  signal(SIGPIPE, SIG_IGN);
  signal_fd_.reset(signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK));
  stop_fd_.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!signal_fd_ || !stop_fd_) return Status::from_errno("signalfd/eventfd", errno);

  auto gpu = gpu::GpuService::create(cfg_.gpu, faults_.fail_gpu_retrieve);
  if (!gpu.ok()) {
    spdlog::error("{}", gpu.status().what());
    return gpu.status();
  }
  gpu_ = std::move(*gpu);
  handler_.set_gpu(gpu_.get());
  if (gpu_->enabled()) {
    KDN_RETURN_IF_ERROR(poller_.add(gpu_->wake_fd(), tag(kGpuWake, 0)));
    spdlog::info("GPU tier on: {} device(s), T0 {} MiB each, host arenas {}pinned", gpu_->device_count(),
                 cfg_.gpu.bytes >> 20, cfg_.gpu.pin_host ? "" : "not ");
  } else {
    spdlog::info("GPU tier off: {}", gpu_->off_reason());
  }

  if (!cfg_.metrics_file.empty()) {
    if (Status st = check_private_dir(parent_dir(cfg_.metrics_file), "metrics directory", &error); !st.ok()) {
      spdlog::error("metrics_file = \"{}\": {}", cfg_.metrics_file, error);
      return st;
    }
  }
  // The socket first: a daemon that cannot listen says so before it spends seconds
  // pre-faulting arenas.
  std::string listen_error;
  auto l = ipc::uds_listen(cfg_.socket_path, listen_options(cfg_), &listen_error);
  if (!l.ok()) {
    spdlog::error("cannot listen: {}", listen_error.empty() ? l.status().what() : listen_error);
    return l.status();
  }
  listen_ = std::move(*l);
  if (!cfg_.metrics_listen.empty()) {
    std::string why;
    auto m = MetricsServer::start(cfg_.metrics_listen, &why);
    if (!m.ok()) {
      spdlog::error("{}", why.empty() ? m.status().what() : why);
      return m.status();
    }
    metrics_server_ = std::move(*m);
    KDN_RETURN_IF_ERROR(poller_.add(metrics_server_->wake_fd(), tag(kScrape, 0)));
    spdlog::info("metrics at http://{}:{}/metrics", metrics_server_->host(), metrics_server_->port());
  }
  std::vector<Prefaulter::Target> prefault;
  for (const NamespaceConfig& nc : cfg_.namespaces) {
    auto ns = open_namespace(nc.name, nc, true);
    if (!ns.ok()) return ns.status();
    if (cfg_.host.populate) {
      const ipc::SharedSegment& arena = (*ns)->host->arena();
      (*ns)->prefault_left.store(arena.size(), std::memory_order_relaxed);
      prefault.push_back({nc.name, arena.data(), arena.size(), &(*ns)->prefault_left});
    }
  }
  KDN_RETURN_IF_ERROR(poller_.add(listen_.get(), tag(kListen, 0)));
  KDN_RETURN_IF_ERROR(poller_.add(signal_fd_.get(), tag(kSignal, 0)));
  KDN_RETURN_IF_ERROR(poller_.add(stop_fd_.get(), tag(kStop, 0)));
  spdlog::info("kdnd listening on {} (protocol {}, {} namespace(s), host arena {} MiB each, eviction {})",
               cfg_.socket_path, KDN_PROTOCOL_VERSION, namespaces_.size(), cfg_.host.bytes >> 20, cfg_.host.eviction);
  prefaulter_.start(std::move(prefault));  // configured namespaces live as long as the daemon
  return OkStatus();
}

Result<Namespace*> DaemonImpl::open_namespace(const std::string& name, const NamespaceConfig& policy, bool configured) {
  if (namespaces_.size() >= cfg_.max_namespaces) return Status(Code::kLimit, "max_namespaces namespaces exist");
  std::string token;
  std::string error;
  Status tok = load_namespace_token(policy, cfg_, &token, &error);
  if (!tok.ok()) {
    spdlog::error("namespace '{}': {}", name, error);
    return tok;
  }
  ipc::SegmentOptions opt;
  opt.populate = false;
  opt.madvise_huge = cfg_.host.hugepages;
  opt.seal_writes = true;  // clients map it read-only; only kdnd's mapping writes chunks
  const uint64_t bytes = policy.max_bytes ? policy.max_bytes : cfg_.host.bytes;
  const std::string seg_name = "kdn-arena-" + name;
  const uint64_t t0 = now_ns();
  auto seg = ipc::SharedSegment::create(seg_name.c_str(), bytes, opt);
  if (!seg.ok()) return seg.status();
  HostArenaOptions ho;
  ho.slab_bytes = cfg_.host.slab_bytes;
  ho.copy_threads = cfg_.host.copy_threads;
  auto host = HostArenaTier::create(std::move(*seg), ho);
  if (!host.ok()) return host.status();
  EvictionKind ev = EvictionKind::kLru;
  (void)parse_eviction_kind(cfg_.host.eviction, &ev);
  TierSetup setup;
  setup.tiers[tier_index(TierId::kHost)] = host->get();
  setup.rules[tier_index(TierId::kHost)] = TierRules{EvictAction::kDrop, ev};
  setup.store.max_demotions = cfg_.host.max_demotions;
  auto ns = std::make_unique<Namespace>();
  ns->name = name;
  ns->policy = policy;
  ns->host = std::move(*host);
  if (gpu_) gpu_->pin_arena(ns->host->arena().data(), ns->host->arena().size());
  KDN_RETURN_IF_ERROR(open_lower_tiers(cfg_, configured, *ns, setup));
  ns->token = token;
  ns->configured = configured;
  auto& region = regions_[name];
  if (region.first == 0) region.first = next_region_++;
  ++region.second;  // memory under this id is new: references to the old arena are stale
  ns->region_id = region.first;
  ns->region_generation = region.second;
  ns->store = std::make_unique<TieredStore>(TierPolicy(setup.tiers, setup.rules), setup.store);
  ns->empty_since_ns = now_ns();
  for (const RecoveredChunk& rc : setup.recovered)
    (void)ns->store->adopt(rc.key, rc.fingerprint, rc.raw_bytes, setup.recovered_in, rc.placement, ns->empty_since_ns);
  KDN_RETURN_IF_ERROR(poll_tiers_of(*ns));
  spdlog::info("namespace '{}': host arena {} MiB mapped in {:.0f} ms{}", name, ns->host->arena().size() >> 20,
               (now_ns() - t0) / 1e6, configured ? "" : " (created by a client)");
  Namespace* raw = ns.get();
  namespaces_.emplace(name, std::move(ns));
  models_.open_group(raw->region_id);  // owed its share of the model table from now on
  counters_.namespaces = namespaces_.size();
  return raw;
}

Status DaemonImpl::poll_tiers_of(const Namespace& ns) {
  for (uint32_t t = tier_index(TierId::kHost); t < kTierCount; ++t) {
    const Tier* tier = ns.tier(TierId(t));
    if (tier == nullptr) continue;
    if (tier->wake_fd() >= 0)
      KDN_RETURN_IF_ERROR(
          poller_.add(tier->wake_fd(), tag(kTierWake, wake_id(ns.region_id, TierId(t), TierFd::kWake))));
    if (tier->poll_fd() >= 0)
      KDN_RETURN_IF_ERROR(
          poller_.add(tier->poll_fd(), tag(kTierWake, wake_id(ns.region_id, TierId(t), TierFd::kPoll))));
  }
  return OkStatus();
}

void DaemonImpl::unpoll_tiers_of(const Namespace& ns) {
  for (uint32_t t = tier_index(TierId::kHost); t < kTierCount; ++t) {
    const Tier* tier = ns.tier(TierId(t));
    if (tier == nullptr) continue;
    if (tier->wake_fd() >= 0) (void)poller_.remove(tier->wake_fd());
    if (tier->poll_fd() >= 0) (void)poller_.remove(tier->poll_fd());
  }
}

// Client-created namespaces without sessions for namespace_grace_s are released with their
// memory (once no transfer can still touch it).
void DaemonImpl::release_namespaces(uint64_t now) {
  const uint64_t grace = uint64_t(cfg_.namespace_grace_s) * 1'000'000'000;
  for (auto it = namespaces_.begin(); it != namespaces_.end();) {
    Namespace& ns = *it->second;
    const bool idle = !ns.configured && ns.sessions == 0 && ns.attached == 0 && ns.store->transfers_in_flight() == 0 &&
                      now - ns.empty_since_ns >= grace;
    if (!idle) {
      ++it;
      continue;
    }
    spdlog::info("namespace '{}' released after {} s without sessions ({} chunks dropped)", ns.name,
                 cfg_.namespace_grace_s, ns.store->index().size());
    unpoll_tiers_of(ns);
    if (gpu_) gpu_->unpin_arena(ns.host->arena().data());  // no GPU batch uses it: attached is 0
    models_.close_group(ns.region_id);
    it = namespaces_.erase(it);
  }
  counters_.namespaces = namespaces_.size();
}

// ---- handshakes -------------------------------------------------------------------------------

// A peer kdnd would refuse whatever its hello said: no namespace admits its uid or groups,
// and it may not create one. It is cut off at accept, before it can hold a pending slot.
bool DaemonImpl::could_connect(const Peer& peer) const {
  if (may_create_namespace(cfg_, peer).ok()) return true;
  for (const auto& [name, ns] : namespaces_)
    if (admits(ns->policy, peer)) return true;
  return false;
}

// Connections are checked by their kernel credentials as they are accepted, then wait for
// their hello under two caps of their own (in all and per uid), apart from the session caps:
// silent connections of one uid cannot lock out another's engines, and a uid kdnd admits
// nowhere holds nothing at all. A full table makes room for a uid holding fewer than another
// (admission.h), so many uids' silent connections cannot lock out one more either.
void DaemonImpl::accept_clients() {
  for (int i = 0; i < 64; ++i) {
    auto c = ipc::uds_accept(listen_.get());
    if (!c.ok()) {
      if (refusal_log_.allow(now_ns())) spdlog::warn("accept on {}: {}", cfg_.socket_path, c.status().what());
      return;
    }
    if (!c->valid()) return;
    const int fd = c->get();
    auto cred = ipc::peer_credentials(fd);
    if (!cred.ok()) {
      counters_.refuse(Refusal::kResources);
      continue;  // closes the socket
    }
    Peer peer{uint32_t(cred->uid), uint32_t(cred->gid), {}};
    if (auto groups = ipc::peer_groups(fd); groups.ok()) peer.groups = std::move(*groups);
    Refusal why = Refusal::kCount;
    if (!could_connect(peer))
      why = Refusal::kUid;
    else if (pending_per_uid_[peer.uid] >= cfg_.max_pending_handshakes_per_uid)
      why = Refusal::kPending;
    else if (pending_.size() >= cfg_.max_pending_handshakes && !make_pending_room(peer.uid))
      why = Refusal::kPending;
    if (why == Refusal::kCount && !poller_.add(fd, tag(kHandshake, uint64_t(fd))).ok()) why = Refusal::kResources;
    if (why != Refusal::kCount) {
      refuse_at_accept(fd, cred->pid, cred->uid, why);
      continue;  // closes the socket
    }
    ++pending_per_uid_[peer.uid];
    pending_.emplace(fd, Pending{std::move(*c), now_ns() + uint64_t(cfg_.handshake_timeout_ms) * 1000000, peer.uid});
    counters_.pending_handshakes = pending_.size();
  }
}

void DaemonImpl::refuse_at_accept(int fd, pid_t pid, uint32_t uid, Refusal why) {
  (void)ipc::server_refuse(fd, why == Refusal::kUid ? Code::kPermission : Code::kBusy);
  counters_.refuse(why);
  if (refusal_log_.allow(now_ns()))
    spdlog::warn("connection of pid {} uid {} refused at accept: {}{}", pid, uid,
                 why == Refusal::kUid       ? "no namespace admits this uid or its groups"
                 : why == Refusal::kPending ? "too many connections wait to say hello (max_pending_handshakes)"
                                            : "out of resources",
                 refusal_log_.suppressed_note());
}

// Refuses the oldest pending connection of the uid holding the most, if `uid` holds fewer.
bool DaemonImpl::make_pending_room(uint32_t uid) {
  const std::optional<uint32_t> giver = pending_to_give_way(pending_per_uid_, uid);
  if (!giver) return false;
  auto oldest = pending_.end();
  for (auto it = pending_.begin(); it != pending_.end(); ++it)
    if (it->second.uid == *giver && (oldest == pending_.end() || it->second.deadline_ns < oldest->second.deadline_ns))
      oldest = it;
  if (oldest == pending_.end()) return false;
  (void)ipc::server_refuse(oldest->first, Code::kBusy);
  counters_.refuse(Refusal::kPending);
  drop_pending(oldest);
  return true;
}

// Forgets a pending connection (closing it unless its socket was taken).
void DaemonImpl::drop_pending(std::unordered_map<int, Pending>::iterator it) {
  (void)poller_.remove(it->first);
  auto n = pending_per_uid_.find(it->second.uid);
  if (n != pending_per_uid_.end() && --n->second == 0) pending_per_uid_.erase(n);
  pending_.erase(it);
  counters_.pending_handshakes = pending_.size();
}

void DaemonImpl::finish_handshake(int fd) {
  auto it = pending_.find(fd);
  if (it == pending_.end()) return;
  ipc::UniqueFd sock = std::move(it->second.sock);
  drop_pending(it);
  // The socket is readable, so the one hello message is already here: no real wait.
  ipc::HelloRefusalInfo why;
  auto hello = ipc::server_receive_hello(fd, 10, &why);
  if (!hello.ok()) {
    const bool version = hello.status().code() == Code::kVersion;
    counters_.refuse(version ? Refusal::kVersion : Refusal::kHello);
    if (version) {
      spdlog::warn("client pid {} (uid {}) speaks protocol {}; this kdnd speaks {}: refused", why.peer.pid,
                   why.peer.uid, why.client_major, KDN_PROTOCOL_VERSION);
    } else if (refusal_log_.allow(now_ns())) {
      spdlog::warn("handshake of pid {} refused: {}{}", why.peer.pid, hello.status().what(),
                   refusal_log_.suppressed_note());
    }
    (void)ipc::server_refuse(fd, hello.status().code());
    return;
  }
  Status st = admit(std::move(sock), *hello);
  if (!st.ok()) {
    const Code c = st.code();
    counters_.refuse(c == Code::kLimit                                ? Refusal::kLimit
                     : c == Code::kPermission || c == Code::kNotFound ? Refusal::kAccess
                                                                      : Refusal::kResources);
    if (refusal_log_.allow(now_ns()))
      spdlog::warn("client pid {} uid {} refused for namespace '{}': {}{}", hello->peer.pid, hello->peer.uid,
                   hello->hello.name_space, st.what(), refusal_log_.suppressed_note());
  }
}

Status DaemonImpl::admit(ipc::UniqueFd sock, const ipc::ReceivedHello& rh) {
  const ipc::HelloMsg& h = rh.hello;
  auto refuse = [&](Status st) {
    (void)ipc::server_refuse(sock.get(), st.code());
    return st;
  };
  Peer peer{rh.peer.uid, rh.peer.gid, {}};
  if (auto groups = ipc::peer_groups(sock.get()); groups.ok()) peer.groups = std::move(*groups);
  const std::string name(h.name_space);
  Namespace* ns = nullptr;
  if (auto it = namespaces_.find(name); it != namespaces_.end()) {
    ns = it->second.get();
  } else {
    if (!(h.flags & ipc::kHelloFlagCreateNamespace)) return refuse(Status(Code::kNotFound, "no such namespace"));
    Status may = may_create_namespace(cfg_, peer);
    if (!may.ok()) return refuse(may);
    auto created = open_namespace(name, client_namespace_policy(cfg_, name, peer), false);
    if (!created.ok()) return refuse(created.status());
    ns = *created;
  }
  if (Status may = may_open(*ns, peer, h.token); !may.ok()) return refuse(may);
  uint32_t of_uid = 0;
  for (Session* s : active_) of_uid += s->uid == rh.peer.uid;
  if (Status share = session_share_allows(cfg_, namespaces_, *ns, active_.size()); !share.ok()) return refuse(share);
  if (of_uid >= cfg_.max_sessions_per_uid)
    return refuse(Status(Code::kLimit, "max_sessions_per_uid sessions of this uid"));
  if (ns->policy.max_sessions && ns->sessions >= ns->policy.max_sessions)
    return refuse(Status(Code::kLimit, "the namespace's max_sessions are open"));
  if (Status budget = staging_budget_allows(*ns, rh.peer.uid, h.staging_bytes); !budget.ok()) return refuse(budget);
  auto layout = ipc::SessionLayout::compute(h.ring_entries, h.payload_bytes);
  if (!layout.ok()) return refuse(layout.status());

  auto s = std::make_unique<Session>();
  s->id = next_session_id_++;
  auto shm = ipc::DaemonSession::create(*layout, s->id);
  if (!shm.ok()) return refuse(shm.status());
  s->shm = std::move(*shm);
  if (h.staging_bytes > 0) {
    auto staging = StagingArea::create(h.staging_bytes);
    if (!staging.ok()) return refuse(staging.status());
    s->staging = std::move(*staging);
    s->staging_region = next_region_++;
  }
  std::vector<ipc::RegionRecord> regions;
  std::vector<int> region_fds;
  regions.push_back({ns->region_id, ns->region_generation, uint32_t(ipc::RegionKind::kHostArena),
                     uint32_t(ipc::RegionAccess::kRead), ns->host->arena().size(), 0});
  region_fds.push_back(ns->host->arena().fd());
  if (s->staging.valid()) {
    regions.push_back({s->staging_region, 1, uint32_t(ipc::RegionKind::kStaging),
                       uint32_t(ipc::RegionAccess::kReadWrite), s->staging.capacity(), 0});
    region_fds.push_back(s->staging.fd());
  }
  const bool admin = (h.flags & ipc::kHelloFlagAdmin) && is_admin(cfg_, *ns, peer);
  const uint32_t granted = (admin ? ipc::kHelloFlagAdmin : 0u) | (h.flags & ipc::kHelloFlagCreateNamespace);
  ipc::WelcomeMsg w = ipc::make_welcome(h, *layout, s->id, granted, regions, handler_.limits());
  KDN_RETURN_IF_ERROR(
      ipc::server_send_welcome(sock.get(), w, s->shm.segment().fd(), s->shm.doorbell().fd(), region_fds));
  s->sock = std::move(sock);
  s->ns = ns;
  s->admin = admin;
  s->node_admin = admin && is_node_admin(cfg_, peer);
  s->pid = rh.peer.pid;
  s->uid = rh.peer.uid;
  s->gid = rh.peer.gid;
  KDN_RETURN_IF_ERROR(poller_.add(s->sock.get(), tag(kSocket, s->id)));
  KDN_RETURN_IF_ERROR(poller_.add(s->shm.doorbell().fd(), tag(kBell, s->id)));
  ++ns->sessions;
  ++ns->attached;
  ns->staging_bytes += s->staging.capacity();
  staging_per_uid_[s->uid] += s->staging.capacity();
  ++counters_.sessions_total;
  counters_.sessions_active = active_.size() + 1;
  spdlog::info("session {} opened: pid {} uid {} namespace '{}', staging {} MiB{}", s->id, s->pid, s->uid, name,
               s->staging.capacity() >> 20, s->admin ? " (admin)" : "");
  active_.push_back(s.get());
  sessions_.emplace(s->id, std::move(s));
  return OkStatus();
}

// ---- sessions ending ----------------------------------------------------------------------------

void DaemonImpl::close_session(Session* s, const char* why) {
  if (s->closed) return;
  std::erase(broken_, s);
  spdlog::info("session {} closed ({}): released {} leases, aborted {} reservations", s->id, why, s->leases.size(),
               s->reservations.size());
  s->held_many_leases = s->leases.size() >= kManyLeases;
  handler_.drop_holdings(*s);
  s->closed = true;
  (void)poller_.remove(s->sock.get());
  (void)poller_.remove(s->shm.doorbell().fd());
  s->sock.reset();
  std::erase(active_, s);
  --s->ns->sessions;
  if (s->ns->sessions == 0) s->ns->empty_since_ns = now_ns();
  counters_.sessions_active = active_.size();
  // Requests that wait for nothing end now; those whose copies still read the staging area
  // keep the session until they land (op_done then destroys it).
  // A COMMIT still finishes (it settles the chunks its copies published).
  auto ends_now = [&](const Op& op) { return op.session == s && op.waiting == 0 && !settles_after_close(op); };
  std::erase_if(runnable_, [&](Op* op) { return ends_now(*op); });
  for (auto it = ops_.begin(); it != ops_.end();) {
    if (ends_now(*it->second)) {
      --s->ops_in_flight;
      it = ops_.erase(it);
    } else {
      ++it;
    }
  }
  if (s->ops_in_flight == 0) destroy_session(s);
}

void DaemonImpl::destroy_session(Session* s) {
  Namespace* ns = s->ns;
  --ns->attached;
  ns->staging_bytes -= s->staging.capacity();
  if (auto it = staging_per_uid_.find(s->uid);
      it != staging_per_uid_.end() && (it->second -= s->staging.capacity()) == 0)
    staging_per_uid_.erase(it);
  release_session_memory(*s);
  const bool trim = s->held_many_leases;
  sessions_.erase(s->id);
  // Its leases' bookkeeping (~100 bytes a chunk) went back to malloc, which keeps it: give it to
  // the kernel, off the loop, so a tenant's disconnected sessions hold no daemon memory.
  if (trim) releaser_.release(std::make_shared<HeapTrim>());
}

// Unmapping a staging area frees every page its client wrote (seconds for gigabytes): that
// happens on the releaser's thread, so a session's end costs the loop O(1).
void DaemonImpl::release_session_memory(Session& s) {
  releaser_.release(s.staging.take_memory());
  try {
    releaser_.release(std::make_shared<ipc::DaemonSession>(std::move(s.shm)));
  } catch (const std::bad_alloc&) {  // the session's segment is then unmapped here, with it
  }
}

// A session's staging area counts against its uid's and its namespace's budgets as long as it
// is mapped: a client may write every page of it, and kdnd holds the memfd.
Status DaemonImpl::staging_budget_allows(const Namespace& ns, uint32_t uid, uint64_t bytes) const {
  if (bytes > cfg_.max_staging_bytes) return Status(Code::kLimit, "staging_bytes above max_staging_bytes");
  auto it = staging_per_uid_.find(uid);
  const uint64_t of_uid = it == staging_per_uid_.end() ? 0 : it->second;
  if (of_uid + bytes > cfg_.max_staging_bytes_per_uid)
    return Status(Code::kLimit, "this uid's sessions hold max_staging_bytes_per_uid of staging");
  if (ns.staging_bytes + bytes > cfg_.max_staging_bytes_per_namespace)
    return Status(Code::kLimit, "the namespace's sessions hold max_staging_bytes_per_namespace of staging");
  return OkStatus();
}

// ---- requests -----------------------------------------------------------------------------------

void DaemonImpl::deliver(Session& s, const ipc::Cqe& c) {
  if (s.closed || s.ring_broken) return;
  if (s.backlog.empty()) {
    auto n = s.shm.complete(std::span<const ipc::Cqe>(&c, 1));
    if (!n.ok()) {
      // Closed at the top of the next turn, not here: the request being retired still
      // counts against the session.
      ++counters_.protocol_errors;
      s.ring_broken = true;
      broken_.push_back(&s);
      return;
    }
    if (*n == 1) return;
  }
  s.backlog.push_back(c);  // the client is not reaping: it gets it later, never lost
}

void DaemonImpl::close_broken() {
  for (Session* s : broken_) close_session(s, "completion ring corrupted by the client");
  broken_.clear();
}

bool DaemonImpl::flush_backlog(Session& s) {
  while (!s.backlog.empty()) {
    const ipc::Cqe c = s.backlog.front();
    auto n = s.shm.complete(std::span<const ipc::Cqe>(&c, 1));
    if (!n.ok() || *n == 0) return false;
    s.backlog.pop_front();
  }
  return true;
}

void DaemonImpl::park(std::unique_ptr<Op> op, Step step) {
  Op* raw = op.get();
  ops_.emplace(raw->token, std::move(op));
  if (step == Step::kMore || (step == Step::kWait && raw->waiting == 0 && !raw->wants_room)) make_runnable(raw);
}

// A request ended: its completion goes out and it stops counting against its session.
void DaemonImpl::retire(Session& s, const Op& op) {
  counters_.observe(op.sqe.opcode, now_ns() - op.started_ns);  // not the client's wake-up
  deliver(s, op.cqe);
  --s.ops_in_flight;
  s.records_in_flight -= std::min<uint64_t>(s.records_in_flight, op.sqe.in_len / sizeof(uint64_t));
}

void DaemonImpl::op_done(Op& op) {
  Session* s = op.session;
  retire(*s, op);
  ops_.erase(op.token);  // destroys op
  if (s->closed && s->ops_in_flight == 0) destroy_session(s);
}

// Pops and starts this session's new requests; false if there were none.
bool DaemonImpl::serve_session(Session& s) {
  if (!s.backlog.empty() && !flush_backlog(s)) return false;  // not reaping: back-pressure
  bool any = false;
  while (s.ops_in_flight < cfg_.max_in_flight && s.records_in_flight < kMaxRecordsInFlight) {
    ipc::Sqe sqe;
    auto n = s.shm.poll(std::span(&sqe, 1));
    if (!n.ok()) {
      ++counters_.protocol_errors;
      close_session(&s, "submission ring corrupted by the client");
      return true;
    }
    if (*n == 0) break;
    any = true;
    ++s.requests;
    ++counters_.requests;
    ++s.ops_in_flight;
    s.records_in_flight += sqe.in_len / sizeof(uint64_t);
    // Most requests finish in their first step: they live on the stack and cost no allocation.
    Op local;
    local.token = next_token_++;
    local.started_ns = now_ns();
    local.session = &s;
    local.sqe = sqe;
    if (sqe.in_len > kInlineInputBytes) {  // large: its turn comes in the runnable queue
      park(std::make_unique<Op>(std::move(local)), Step::kMore);
      continue;
    }
    const Step step = handler_.step(local, local.started_ns + uint64_t(cfg_.slice_us) * 1000);
    if (step != Step::kDone) {
      park(std::make_unique<Op>(std::move(local)), step);
      continue;
    }
    retire(s, local);
    if (s.ring_broken) return true;
  }
  return any;
}

bool DaemonImpl::poll_sessions() {
  bool any = false;
  const size_t n = active_.size();
  for (size_t i = 0; i < n && i < active_.size(); ++i) {
    Session* s = active_[(rr_ + i) % active_.size()];
    any |= serve_session(*s);
  }
  if (!active_.empty()) rr_ = (rr_ + 1) % active_.size();
  return any;
}

// One slice of the oldest runnable request.
bool DaemonImpl::run_slice() {
  if (runnable_.empty()) return false;
  Op* op = runnable_.front();
  runnable_.pop_front();
  op->queued = false;
  // A closed session's requests only finish what they started: a COMMIT settles the chunks
  // its copies published; anything else would take holdings nobody releases.
  if (op->session->closed && !settles_after_close(*op)) {
    if (op->waiting == 0) op_done(*op);
    return true;
  }
  const Step step = handler_.step(*op, now_ns() + uint64_t(cfg_.slice_us) * 1000);
  if (step == Step::kDone)
    op_done(*op);
  else if (step == Step::kMore || (op->waiting == 0 && !op->wants_room))
    make_runnable(op);
  return true;
}

// Applies the GPU batches that landed: their leases and pins go, GPU_STOREs wake.
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
// index from (T2), so a restart serves them.
void DaemonImpl::write_down_on_stop() {
  for (auto& [name, ns] : namespaces_) {
    Tier* target = nullptr;
    ns->for_each_lower([&](Tier& t) {
      if (target == nullptr && t.capabilities().indexed_at_start) target = &t;
    });
    if (target == nullptr) continue;
    if (cfg_.disk.flush_on_stop) write_down(name, *ns, *target);
    ns->for_each_lower([](Tier& t) { t.drain(); });
  }
}

// Each chunk is tried once: a tier that fails them all must not keep kdnd from exiting.
void DaemonImpl::write_down(const std::string& name, Namespace& ns, Tier& target) {
  const uint64_t t0 = now_ns();
  uint64_t started = 0, last_log = t0;
  const char* where = tier_name(target.id());
  const uint64_t written_before = ns.store->counters().written_through_chunks;
  const uint64_t budget = ns.store->host_only_chunks();
  if (budget > 0)
    spdlog::info("namespace '{}': writing {} chunks held only in the arena to the {} tier before exiting", name, budget,
                 where);
  for (;;) {
    // Keep the device's queue full, not the whole arena in flight at once.
    const uint64_t room = target.queue_room();
    const uint64_t in_flight = ns.store->transfers_in_flight();
    if (in_flight < room) {
      const uint64_t n = started < budget ? ns.store->write_down(std::min(room - in_flight, budget - started)) : 0;
      started += n;
      if (n == 0 && in_flight == 0) break;
    }
    events_.clear();
    bool room_freed = false;
    if (ns.store->poll(events_, &room_freed) == 0 && ns.store->transfers_in_flight() > 0) (void)target.advance(true);
    if (now_ns() - last_log > 1'000'000'000) {
      spdlog::info("namespace '{}': writing the arena down before exiting: {} chunks so far", name,
                   ns.store->counters().written_through_chunks - written_before);
      last_log = now_ns();
    }
  }
  if (started > 0)
    spdlog::info("namespace '{}': wrote {} arena chunks to the {} tier in {:.2f} s before exiting", name,
                 ns.store->counters().written_through_chunks - written_before, where, (now_ns() - t0) / 1e9);
}

std::vector<NamespaceMetrics> DaemonImpl::metrics_namespaces() const {
  std::vector<NamespaceMetrics> ns;
  for (auto& [name, n] : namespaces_) ns.push_back({name, n.get()});
  return ns;
}

// METRICS as an admin session sees it: the whole page for an admin of every namespace; for a
// namespace's own admin, the series of the namespaces that name its uid and nothing
// daemon-wide (other tenants' traffic shows in those totals).
std::string DaemonImpl::metrics_page_for(const Session& s) const {
  if (s.node_admin) return prometheus_text(&counters_, metrics_namespaces(), gpu_.get());
  std::vector<NamespaceMetrics> ns;
  for (auto& [name, n] : namespaces_)
    if (administers(*n, s.uid)) ns.push_back({name, n.get()});
  return prometheus_text(nullptr, ns, nullptr);
}

void DaemonImpl::write_metrics() {
  last_metrics_ns_ = now_ns();
  std::string error;
  Status st = write_prometheus_file(cfg_.metrics_file, counters_, metrics_namespaces(), &error, gpu_.get());
  if (!st.ok() && error.empty()) error = st.what();
  if (error != metrics_error_) {  // a failure is logged once, and so is the recovery
    if (error.empty())
      spdlog::info("metrics file {} written again", cfg_.metrics_file);
    else
      spdlog::warn("metrics file: {}", error);
    metrics_error_ = std::move(error);
  }
}

Daemon::Daemon(Config config, DaemonFaults faults) : impl_(std::make_unique<DaemonImpl>(std::move(config), faults)) {}
Daemon::~Daemon() = default;
Status Daemon::start() { return impl_->start(); }
Status Daemon::run() { return impl_->run(); }
void Daemon::request_stop() { impl_->request_stop(); }

}  // namespace kdn::sidecar
