// Admission and sessions ending: accepting clients, pending handshakes and their shares, refusals
// a client can read, admitting a hello as a session, and closing and destroying sessions.
#include "daemon_impl.h"

#include "admission.h"

#include <kdn/common/clock.h>
#include <malloc.h>
#include <spdlog/spdlog.h>

namespace kdn::sidecar {
using namespace daemon_detail;
namespace {

// Sessions that held this many leased chunks or more have the heap trimmed after they end.
constexpr size_t kManyLeases = 4096;

// Dropped on the MemoryReleaser's thread: returns the heap's free memory to the kernel then.
struct HeapTrim {
  ~HeapTrim() { ::malloc_trim(0); }
};

}  // namespace

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

}  // namespace kdn::sidecar
