// Client: the C++ core behind the C ABI — one connection to kdnd, its rings and payload
// area, and synchronous and asynchronous request plumbing.
//
// Not thread-safe (see kdn/kdn.h): one thread drives a client at a time.
#pragma once

#include "payload_allocator.h"

#include <kdn/common/model.h>
#include <kdn/ipc/ops.h>
#include <kdn/ipc/protocol.h>
#include <kdn/ipc/session.h>
#include <kdn/kdn.h>

#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace kdn::shim {

// A request's payload in the shared area: input bytes, output capacity.
struct Request {
  ipc::Sqe sqe{};
  PayloadRange in, out;
};

// Default staging area of a client that does not say (kdn_connect_opts.staging_bytes = 0).
constexpr uint64_t kDefaultStagingBytes = 256ull << 20;

class Client {
 public:
  // `map_eagerly`: fault the arena's page tables in at connect, as the data path needs (a tool
  // that reads no chunk, kdnctl, maps lazily and connects in microseconds, not ~0.1 s/GiB).
  static Result<std::unique_ptr<Client>> connect(const kdn_connect_opts* opts, uint32_t hello_flags,
                                                 bool map_eagerly = true);

  // Payload space for one request (released with free_payload or by finish()).
  Result<PayloadRange> alloc_payload(uint32_t bytes);
  void free_payload(PayloadRange r) { payload_alloc_.free(r); }
  std::byte* payload_ptr(PayloadRange r) const { return session_.payload() + r.off; }

  // Posts a request; returns its user_data. KDN_ERR_BUSY if too many are in flight.
  Result<uint64_t> post(Request& r);
  // True once the completion for `ud` arrived (then take() returns it).
  Result<bool> poll(uint64_t ud);
  Status wait(uint64_t ud, uint32_t timeout_ms);
  ipc::Cqe take(uint64_t ud);
  // post + wait + take, releasing nothing: the caller reads r.out then frees.
  Result<ipc::Cqe> call(Request& r);
  // Posts a request nobody waits for: its payload is freed and its completion dropped when it
  // is reaped (by any later call). Same errors as post().
  Status post_detached(Request& r);

  // The bytes a slot reference from kdnd names (checked: region, generation, range).
  Result<std::byte*> resolve(const ipc::SlotRef& ref, uint64_t bytes, ipc::RegionKind kind) const {
    return session_.resolve(ref, bytes, kind);
  }
  const ipc::WelcomeMsg& welcome() const { return session_.welcome(); }
  bool daemon_sleeping() const { return session_.daemon_sleeping(); }
  uint64_t staging_bytes() const;
  uint64_t arena_bytes() const;
  uint32_t default_timeout_ms() const { return timeout_ms_; }
  bool broken() const { return broken_; }
  // After a timed-out synchronous call the daemon may still write into that call's payload,
  // so the connection is retired rather than reused.
  void mark_broken() { broken_ = true; }

  // Models registered through this client (owned here; freed with the client, or moved to
  // the connection that replaces it after kdnd restarted).
  std::vector<std::unique_ptr<kdn_model>> models;
  // Leases, reservations and ops made on this connection and not yet released: a connection
  // replaced after a restart stays mapped until they are (their pointers point into it).
  uint32_t handles_out = 0;

 private:
  Client() = default;
  Status reap_all();
  // True once kdnd hung up (it never writes to the socket after the handshake).
  bool daemon_gone() const;

  ipc::UniqueFd sock_;  // kept open: its hang-up tells kdnd this client is gone
  ipc::ClientSession session_;
  PayloadAllocator payload_alloc_;
  uint32_t timeout_ms_ = 5000;
  uint64_t next_ud_ = 1;
  uint32_t in_flight_ = 0;
  std::unordered_set<uint64_t> pending_;
  std::unordered_map<uint64_t, ipc::Cqe> done_;
  std::unordered_map<uint64_t, PayloadRange> detached_;  // posted by post_detached
  bool broken_ = false;
};

}  // namespace kdn::shim

struct kdn_model {
  uint32_t id = 0;
  kdn::ModelInfo info{};
};
