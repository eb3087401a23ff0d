#include "client.h"

#include <kdn/common/clock.h>
#include <kdn/ipc/handshake.h>
#include <kdn/ipc/uds.h>

#include <poll.h>

#include <algorithm>

namespace kdn::shim {

// How long a waiting client spins before it sleeps on the futex. Waking a sleeper costs tens
// of microseconds on virtual machines, far more than a request, so spin well past that.
constexpr uint64_t kClientSpinNs = 100'000;

Result<std::unique_ptr<Client>> Client::connect(const kdn_connect_opts* opts, uint32_t hello_flags, bool map_eagerly) {
  kdn_connect_opts o{};
  o.struct_size = sizeof o;
  if (opts) {
    if (opts->struct_size != sizeof(kdn_connect_opts))
      return Status(Code::kVersion, "kdn_connect_opts.struct_size does not match this library");
    o = *opts;
  }
  const std::string path = o.socket_path && *o.socket_path ? o.socket_path : ipc::default_socket_path();
  const uint32_t timeout = o.timeout_ms ? o.timeout_ms : 5000;
  ipc::HelloRequest req;
  req.name_space = o.name_space && *o.name_space ? o.name_space : "default";
  req.token = o.token ? o.token : "";
  req.ring_entries = o.ring_entries ? o.ring_entries : 256;
  req.payload_bytes = o.payload_bytes ? o.payload_bytes : (1u << 20);
  req.flags = hello_flags | ((o.flags & KDN_CONNECT_CREATE_NAMESPACE) ? ipc::kHelloFlagCreateNamespace : 0u) |
              ((o.flags & KDN_CONNECT_ADMIN) ? ipc::kHelloFlagAdmin : 0u);
  if ((o.flags & ~(KDN_CONNECT_CREATE_NAMESPACE | KDN_CONNECT_READ_ONLY | KDN_CONNECT_ADMIN)) != 0)
    return Status(Code::kInvalidArgument, "unknown kdn_connect_opts.flags");
  req.staging_bytes = (o.flags & KDN_CONNECT_READ_ONLY) ? 0 : o.staging_bytes ? o.staging_bytes : kDefaultStagingBytes;
  auto hello = ipc::make_hello(req);
  if (!hello.ok()) return hello.status();
  auto sock = ipc::uds_connect(path, timeout);
  if (!sock.ok()) return sock.status();
  auto hs = ipc::client_handshake(sock->get(), *hello, timeout);
  if (!hs.ok()) return hs.status();
  // Map the arena (read-only: kdnd sealed it) and the staging area with their page-table
  // entries filled in now: a store or retrieve must never take a page fault per 4 KiB page in
  // the data path (a first touch of a shared page costs ~3 us here, 10x the copy of it). The
  // staging area's pages are allocated now, once, and reused store after store.
  ipc::MapOptions arena_map;
  arena_map.populate = map_eagerly;
  arena_map.madvise_huge = true;
  ipc::MapOptions staging_map = arena_map;
  auto session = ipc::ClientSession::attach(std::move(*hs), kClientSpinNs, arena_map, staging_map);
  if (!session.ok()) return session.status();
  std::unique_ptr<Client> c(new Client());
  c->session_ = std::move(*session);
  c->payload_alloc_.reset(c->session_.payload_bytes());
  c->timeout_ms_ = timeout;
  c->sock_ = std::move(*sock);
  return c;
}

uint64_t Client::staging_bytes() const {
  const ipc::ClientRegion* r = session_.region(ipc::RegionKind::kStaging);
  return r ? r->segment.size() : 0;
}

uint64_t Client::arena_bytes() const {
  const ipc::ClientRegion* r = session_.region(ipc::RegionKind::kHostArena);
  return r ? r->segment.size() : 0;
}

Result<PayloadRange> Client::alloc_payload(uint32_t bytes) {
  auto r = payload_alloc_.alloc(bytes);
  if (!r) return Status(Code::kBusy, "payload area exhausted by requests in flight");
  return *r;
}

Result<uint64_t> Client::post(Request& r) {
  if (broken_) return Status(Code::kUnavailable, "connection to kdnd is broken");
  if (in_flight_ >= session_.ring_entries()) {
    KDN_RETURN_IF_ERROR(reap_all());
    if (in_flight_ >= session_.ring_entries()) return Status(Code::kBusy, "too many operations in flight");
  }
  r.sqe.user_data = next_ud_++;
  r.sqe.in_off = r.in.off;
  r.sqe.out_off = r.out.off;  // in_len/out_len are set by the caller, in exact record bytes
  auto n = session_.submit(std::span<const ipc::Sqe>(&r.sqe, 1));
  if (!n.ok()) {
    broken_ = true;
    return n.status();
  }
  if (*n != 1) return Status(Code::kBusy, "submission ring full");
  ++in_flight_;
  pending_.insert(r.sqe.user_data);
  return r.sqe.user_data;
}

Status Client::reap_all() {
  ipc::Cqe cqes[64];
  for (;;) {
    auto n = session_.reap(cqes);
    if (!n.ok()) {
      broken_ = true;
      return n.status();
    }
    for (uint32_t i = 0; i < *n; ++i) {
      // A completion for nothing we posted is a daemon bug or corruption: ignore it.
      if (pending_.erase(cqes[i].user_data) == 0) continue;
      --in_flight_;
      if (auto d = detached_.find(cqes[i].user_data); d != detached_.end()) {
        payload_alloc_.free(d->second);
        detached_.erase(d);
        continue;
      }
      done_.emplace(cqes[i].user_data, cqes[i]);
    }
    if (*n < 64) return OkStatus();
  }
}

Result<bool> Client::poll(uint64_t ud) {
  if (done_.count(ud)) return true;
  KDN_RETURN_IF_ERROR(reap_all());
  return done_.count(ud) != 0;
}

Status Client::wait(uint64_t ud, uint32_t timeout_ms) {
  const uint64_t deadline = now_ns() + uint64_t(timeout_ms ? timeout_ms : timeout_ms_) * 1000000;
  for (;;) {
    auto p = poll(ud);
    if (!p.ok()) return p.status();
    if (*p) return OkStatus();
    const uint64_t now = now_ns();
    if (now >= deadline) return Status(Code::kTimeout, "kdnd did not answer in time");
    // Sleep in short slices so a dead daemon is noticed at once (its socket hangs up)
    // instead of after the whole timeout.
    Status st = session_.wait_for_completion(std::min<uint64_t>(deadline - now, 20'000'000));
    if (st.code() == Code::kTimeout) {
      if (daemon_gone()) {
        broken_ = true;
        return Status(Code::kUnavailable, "kdnd closed the connection");
      }
      continue;
    }
    if (!st.ok()) {
      broken_ = true;
      return st;
    }
  }
}

bool Client::daemon_gone() const {
  pollfd p{sock_.get(), POLLIN | POLLRDHUP, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLHUP | POLLRDHUP | POLLERR | POLLIN));
}

ipc::Cqe Client::take(uint64_t ud) {
  auto it = done_.find(ud);
  ipc::Cqe c = it->second;
  done_.erase(it);
  return c;
}

Status Client::post_detached(Request& r) {
  detached_.reserve(detached_.size() + 1);  // may throw: before anything is posted
  auto ud = post(r);
  if (!ud.ok()) return ud.status();
  detached_.emplace(*ud, r.in);
  return OkStatus();
}

Result<ipc::Cqe> Client::call(Request& r) {
  auto ud = post(r);
  if (!ud.ok()) return ud.status();
  Status st = wait(*ud, 0);
  if (!st.ok()) {
    broken_ = true;
    return st;
  }
  return take(*ud);
}

}  // namespace kdn::shim
