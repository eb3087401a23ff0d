#include <kdn/sidecar/daemon.h>

#include "metrics.h"
#include "request_handler.h"
#include "session.h"

#include <kdn/common/clock.h>
#include <kdn/ipc/doorbell.h>
#include <kdn/ipc/handshake.h>
#include <kdn/ipc/uds.h>

#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <map>
#include <unordered_map>
#include <vector>

namespace kdn::sidecar {
namespace {

// epoll tags: the top byte says what the fd is, the rest identifies it.
enum TagKind : uint64_t { kListen = 1, kSignal = 2, kStop = 3, kHandshake = 4, kSocket = 5, kBell = 6 };
constexpr uint64_t tag(TagKind k, uint64_t id) { return (uint64_t(k) << 56) | (id & ((1ull << 56) - 1)); }
constexpr TagKind tag_kind(uint64_t t) { return TagKind(t >> 56); }
constexpr uint64_t tag_id(uint64_t t) { return t & ((1ull << 56) - 1); }

bool valid_namespace_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '-';
}

}  // namespace

class DaemonImpl {
 public:
  explicit DaemonImpl(Config c) : cfg_(std::move(c)), handler_(models_, counters_) {}

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
  };

  bool poll_sessions();
  void serve_session(Session& s, std::vector<Session*>& dead);
  bool flush_backlog(Session& s);
  Status service_control(int timeout_ms);
  void sleep_until_work();
  int next_timeout_ms() const;
  void accept_clients();
  void finish_handshake(int fd);
  Status admit(ipc::UniqueFd sock, const ipc::ReceivedHello& hello);
  Result<Namespace*> namespace_for(const std::string& name, bool populate);
  void drop_session(Session* s, const char* why);
  void expire_handshakes();
  void write_metrics();

  Config cfg_;
  EvictionKind eviction_ = EvictionKind::kLru;
  ipc::UniqueFd listen_, signal_fd_, stop_fd_;
  ipc::EventPoller poller_;
  std::map<std::string, std::unique_ptr<Namespace>> namespaces_;
  std::unordered_map<uint64_t, std::unique_ptr<Session>> sessions_;
  std::vector<Session*> active_;
  std::unordered_map<int, Pending> pending_;
  ModelTable models_;
  DaemonCounters counters_;
  RequestHandler handler_;
  uint64_t next_session_id_ = 1;
  uint64_t last_metrics_ns_ = 0;
  std::atomic<bool> stop_{false};
};

Status DaemonImpl::start() {
  KDN_RETURN_IF_ERROR(cfg_.validate());
  if (!parse_eviction_kind(cfg_.host.eviction, &eviction_))
    return Status(Code::kInvalidArgument, "unknown eviction policy");
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

  auto ns = namespace_for("default", cfg_.host.populate);
  if (!ns.ok()) return ns.status();
  auto l = ipc::uds_listen(cfg_.socket_path);
  if (!l.ok()) return l.status();
  listen_ = std::move(*l);
  KDN_RETURN_IF_ERROR(poller_.add(listen_.get(), tag(kListen, 0)));
  KDN_RETURN_IF_ERROR(poller_.add(signal_fd_.get(), tag(kSignal, 0)));
  KDN_RETURN_IF_ERROR(poller_.add(stop_fd_.get(), tag(kStop, 0)));
  spdlog::info("kdnd listening on {} (host arena {} MiB per namespace, eviction {}, protocol {})",
               cfg_.socket_path, cfg_.host.bytes >> 20, cfg_.host.eviction, KDN_PROTOCOL_VERSION);
  return OkStatus();
}

Result<Namespace*> DaemonImpl::namespace_for(const std::string& name, bool populate) {
  if (auto it = namespaces_.find(name); it != namespaces_.end()) return it->second.get();
  if (namespaces_.size() >= cfg_.max_namespaces) return Status(Code::kNoSpace, "too many namespaces");
  ipc::SegmentOptions opt;
  opt.populate = populate;
  opt.madvise_huge = cfg_.host.hugepages;
  const std::string seg_name = "kdn-arena-" + name;
  const uint64_t t0 = now_ns();
  auto seg = ipc::SharedSegment::create(seg_name.c_str(), cfg_.host.bytes, opt);
  if (!seg.ok()) return seg.status();
  auto ns = std::make_unique<Namespace>(name, std::move(*seg), cfg_.host.slab_bytes, eviction_);
  spdlog::info("namespace '{}': host arena {} MiB{} in {:.0f} ms", name, ns->arena.size() >> 20,
               populate ? " (pre-faulted)" : "", (now_ns() - t0) / 1e6);
  Namespace* raw = ns.get();
  namespaces_.emplace(name, std::move(ns));
  return raw;
}

void DaemonImpl::accept_clients() {
  for (int i = 0; i < 64; ++i) {
    auto c = ipc::uds_accept(listen_.get());
    if (!c.ok()) {
      spdlog::warn("accept: {}", c.status().what());
      return;
    }
    if (!c->valid()) return;
    const int fd = c->get();
    if (pending_.size() + sessions_.size() >= 2 * size_t(cfg_.max_sessions)) {
      (void)ipc::server_send_refusal(fd, Code::kBusy);
      ++counters_.handshakes_refused;
      continue;  // closes the socket
    }
    if (!poller_.add(fd, tag(kHandshake, uint64_t(fd))).ok()) continue;
    pending_.emplace(fd, Pending{std::move(*c), now_ns() + uint64_t(cfg_.handshake_timeout_ms) * 1000000});
  }
}

void DaemonImpl::finish_handshake(int fd) {
  auto it = pending_.find(fd);
  if (it == pending_.end()) return;
  ipc::UniqueFd sock = std::move(it->second.sock);
  pending_.erase(it);
  (void)poller_.remove(fd);
  // The socket is readable, so the one hello message is already here: no real wait.
  auto hello = ipc::server_receive_hello(fd, 10);
  if (!hello.ok()) {
    ++counters_.handshakes_refused;
    spdlog::warn("handshake refused: {}", hello.status().what());
    (void)ipc::server_send_refusal(fd, hello.status().code());
    return;
  }
  Status st = admit(std::move(sock), *hello);
  if (!st.ok()) {
    ++counters_.handshakes_refused;
    spdlog::warn("client pid {} refused: {}", hello->peer.pid, st.what());
  }
}

Status DaemonImpl::admit(ipc::UniqueFd sock, const ipc::ReceivedHello& rh) {
  const ipc::HelloMsg& h = rh.hello;
  auto refuse = [&](Code c, const char* why) {
    (void)ipc::server_send_refusal(sock.get(), c);
    return Status(c, why);
  };
  const NamespaceConfig* allowed = cfg_.find_namespace("default");
  if (rh.peer.uid != 0 && (!allowed || std::find(allowed->allow_uids.begin(), allowed->allow_uids.end(),
                                                 rh.peer.uid) == allowed->allow_uids.end()))
    return refuse(Code::kPermission, "client uid not in the default namespace's allow_uids");
  if (!cfg_.token.empty() && !ipc::token_equals(h.token, cfg_.token.c_str()))
    return refuse(Code::kPermission, "bad token");
  if (sessions_.size() >= cfg_.max_sessions) return refuse(Code::kBusy, "too many sessions");
  std::string ns_name(h.name_space);
  if (ns_name.empty()) ns_name = "default";
  for (char c : ns_name)
    if (!valid_namespace_char(c)) return refuse(Code::kInvalidArgument, "bad namespace name");
  auto ns = namespace_for(ns_name, false);
  if (!ns.ok()) return refuse(ns.status().code(), ns.status().what());
  auto layout = ipc::SessionLayout::compute(h.ring_entries, h.payload_bytes);
  if (!layout.ok()) return refuse(layout.status().code(), layout.status().what());
  const uint64_t id = next_session_id_++;
  auto shm = ipc::DaemonSession::create(*layout, id);
  if (!shm.ok()) return refuse(shm.status().code(), shm.status().what());
  const uint32_t granted = h.flags & ipc::kHelloFlagAdmin;
  ipc::WelcomeMsg w = ipc::make_welcome(h, *layout, id, (*ns)->arena.size(), granted);
  KDN_RETURN_IF_ERROR(ipc::server_send_welcome(sock.get(), w, shm->segment().fd(), (*ns)->arena.fd(),
                                               shm->doorbell().fd()));
  auto s = std::make_unique<Session>();
  s->id = id;
  s->sock = std::move(sock);
  s->shm = std::move(*shm);
  s->ns = *ns;
  s->admin = granted != 0;
  s->pid = rh.peer.pid;
  s->uid = rh.peer.uid;
  KDN_RETURN_IF_ERROR(poller_.add(s->sock.get(), tag(kSocket, id)));
  KDN_RETURN_IF_ERROR(poller_.add(s->shm.doorbell().fd(), tag(kBell, id)));
  ++(*ns)->sessions;
  ++counters_.sessions_total;
  counters_.sessions_active = sessions_.size() + 1;
  spdlog::info("session {} opened: pid {} uid {} namespace '{}'{}", id, s->pid, s->uid, ns_name,
               s->admin ? " (admin)" : "");
  active_.push_back(s.get());
  sessions_.emplace(id, std::move(s));
  return OkStatus();
}

void DaemonImpl::drop_session(Session* s, const char* why) {
  spdlog::info("session {} closed ({}): released {} leases, aborted {} reservations", s->id, why,
               s->leases.size(), s->reservations.size());
  s->drop_holdings();
  (void)poller_.remove(s->sock.get());
  (void)poller_.remove(s->shm.doorbell().fd());
  --s->ns->sessions;
  std::erase(active_, s);
  sessions_.erase(s->id);
  counters_.sessions_active = sessions_.size();
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

void DaemonImpl::serve_session(Session& s, std::vector<Session*>& dead) {
  if (!s.backlog.empty() && !flush_backlog(s)) return;  // client is not reaping: back-pressure
  ipc::Sqe sqes[32];
  auto n = s.shm.poll(sqes);
  if (!n.ok()) {
    ++counters_.protocol_errors;
    dead.push_back(&s);
    return;
  }
  if (*n == 0) return;
  ipc::Cqe cqes[32];
  for (uint32_t i = 0; i < *n; ++i) cqes[i] = handler_.handle(s, sqes[i]);
  auto done = s.shm.complete(std::span<const ipc::Cqe>(cqes, *n));
  if (!done.ok()) {
    ++counters_.protocol_errors;
    dead.push_back(&s);
    return;
  }
  for (uint32_t i = *done; i < *n; ++i) s.backlog.push_back(cqes[i]);
}

bool DaemonImpl::poll_sessions() {
  std::vector<Session*> dead;
  uint64_t before = counters_.requests;
  for (Session* s : active_) serve_session(*s, dead);
  for (Session* s : dead) drop_session(s, "ring corrupted by the client");
  return counters_.requests != before;
}

int DaemonImpl::next_timeout_ms() const {
  int t = -1;
  if (!cfg_.metrics_file.empty()) t = 1000;
  const uint64_t now = now_ns();
  for (auto& [fd, p] : pending_) {
    const int ms = p.deadline_ns > now ? int((p.deadline_ns - now) / 1000000) + 1 : 0;
    if (t < 0 || ms < t) t = ms;
  }
  return t;
}

void DaemonImpl::expire_handshakes() {
  const uint64_t now = now_ns();
  std::vector<int> late;
  for (auto& [fd, p] : pending_)
    if (p.deadline_ns <= now) late.push_back(fd);
  for (int fd : late) {
    (void)poller_.remove(fd);
    pending_.erase(fd);  // closes the socket: a client that never says hello is cut off
    ++counters_.handshakes_refused;
  }
}

Status DaemonImpl::service_control(int timeout_ms) {
  uint64_t tags[64];
  auto n = poller_.wait(tags, timeout_ms);
  if (!n.ok()) return n.status();
  for (size_t i = 0; i < *n; ++i) {
    const uint64_t id = tag_id(tags[i]);
    switch (tag_kind(tags[i])) {
      case kListen: accept_clients(); break;
      case kHandshake: finish_handshake(int(id)); break;
      case kSignal: {
        signalfd_siginfo si;
        while (::read(signal_fd_.get(), &si, sizeof si) == sizeof si) {
          spdlog::info("signal {}: shutting down", si.ssi_signo);
          stop_.store(true, std::memory_order_relaxed);
        }
        break;
      }
      case kStop: stop_.store(true, std::memory_order_relaxed); break;
      case kSocket: {
        auto it = sessions_.find(id);
        if (it != sessions_.end()) drop_session(it->second.get(), "client hung up");
        break;
      }
      case kBell: {
        auto it = sessions_.find(id);
        if (it != sessions_.end()) (void)it->second->shm.doorbell().drain();
        break;
      }
    }
  }
  if (!pending_.empty()) expire_handshakes();
  if (!cfg_.metrics_file.empty() && now_ns() - last_metrics_ns_ >= 1000000000ull) write_metrics();
  return OkStatus();
}

void DaemonImpl::sleep_until_work() {
  for (Session* s : active_) s->shm.set_sleeping(true);
  ipc::sleep_fence();  // SYNC POINT: need_wakeup stores before the ring re-check below
  bool work = false;
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
    if (poll_sessions()) {
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
  spdlog::info("closing {} sessions", sessions_.size());
  while (!active_.empty()) drop_session(active_.back(), "daemon shutting down");
  listen_.reset();
  ::unlink(cfg_.socket_path.c_str());
  return OkStatus();
}

void DaemonImpl::write_metrics() {
  last_metrics_ns_ = now_ns();
  std::vector<NamespaceMetrics> ns;
  for (auto& [name, n] : namespaces_) ns.push_back({name, &n->store, n->sessions});
  Status st = write_prometheus_file(cfg_.metrics_file, counters_, ns);
  if (!st.ok()) spdlog::warn("metrics: {}", st.what());
}

Daemon::Daemon(Config config) : impl_(std::make_unique<DaemonImpl>(std::move(config))) {}
Daemon::~Daemon() = default;
Status Daemon::start() { return impl_->start(); }
Status Daemon::run() { return impl_->run(); }
void Daemon::request_stop() { impl_->request_stop(); }

}  // namespace kdn::sidecar
