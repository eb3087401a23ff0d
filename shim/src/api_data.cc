// Data-path entry points of the C ABI: lookup, leases, reservations, copy variants, async
// ops and stats.
#include "handles.h"

#include <kdn/ipc/payload.h>
#include <kdn/kernels/layout.h>
#include <kdn/kernels/ops.h>
#include <kdn/kernels/stream_copy.h>

#include <algorithm>
#include <cstring>
#include <new>

using kdn::Code;
using kdn::Status;
using kdn::ipc::Opcode;
using namespace kdn::shim;

namespace kdn::shim {

Result<uint32_t> build_key_request(Client& c, const kdn_model& m, const int32_t* tokens, size_t n, uint32_t first,
                                   uint32_t count, uint32_t out_record, Request& r) {
  const uint64_t whole = n / m.info.chunk_tokens;
  if (first > whole) return Status(Code::kInvalidArgument, "first_chunk beyond the tokens given");
  uint64_t want = whole - first;
  if (count && count < want) want = count;
  if (want > ipc::kMaxKeysPerOp) want = ipc::kMaxKeysPerOp;
  const uint32_t k = uint32_t(want);
  const uint64_t total = uint64_t(first) + k;
  // Keys chain from chunk 0, so compute them all and send the requested window.
  std::vector<kdn_key> keys(total);
  prefix_keys(m.info, {tokens, size_t(total) * m.info.chunk_tokens}, keys);
  auto in = c.alloc_payload(k * sizeof(kdn_key));
  if (!in.ok()) return in.status();
  auto out = c.alloc_payload(k * out_record);
  if (!out.ok()) {
    c.free_payload(*in);
    return out.status();
  }
  std::memcpy(c.payload_ptr(*in), keys.data() + first, k * sizeof(kdn_key));
  if (r.sqe.opcode == uint8_t(ipc::Opcode::kReserve) && c.welcome().proto_minor >= 3 && total > 0)
    ipc::ReserveOp::put(ipc::ReserveOp::Args{m.id, first + 1, keys[0]}, r.sqe);  // for kdnctl ls
  r.in = *in;
  r.out = *out;
  r.sqe.model_id = m.id;
  r.sqe.in_len = k * sizeof(kdn_key);
  r.sqe.out_len = k * out_record;
  return k;
}

}  // namespace kdn::shim

namespace {

// Runs a request whose completion counts its output records in res[count_index], copies
// those records out of the payload area (at most `max`: more is a protocol error) and frees
// the request's payload. A failed CQE status comes back as the Cqe, with no records.
template <class T>
kdn::Result<kdn::ipc::Cqe> call_for_records(Client& c, Request& r, uint32_t max, int count_index,
                                            std::vector<T>* records) {
  auto cqe = c.call(r);
  c.free_payload(r.in);
  if (cqe.ok() && cqe->status == KDN_OK) {
    const uint64_t n = cqe->res[count_index];
    if (n > max) {
      c.free_payload(r.out);
      return Status(Code::kProtocol, "kdnd returned more records than asked for");
    }
    records->resize(n);
    if (n) std::memcpy(records->data(), c.payload_ptr(r.out), n * sizeof(T));
  }
  c.free_payload(r.out);
  return cqe;
}

int fill_lookup(const kdn::ipc::Cqe& c, uint32_t keys_sent, uint32_t chunk_tokens, kdn_lookup_result* out) {
  *out = kdn_lookup_result{};
  auto r = kdn::ipc::LookupOp::result(c, keys_sent);
  if (!r.ok()) return rc(r.status());
  out->hit_chunks = r->hit_chunks;
  out->hit_tokens = uint64_t(out->hit_chunks) * chunk_tokens;
  for (uint32_t t = 0; t < KDN_TIER_COUNT; ++t) out->tier_chunks[t] = r->tier_chunks[t];
  return KDN_OK;
}

int release_ids(Client& c, Opcode op, const std::vector<uint64_t>& ids) {
  std::vector<uint64_t> live;
  for (uint64_t id : ids)
    if (id) live.push_back(id);
  if (live.empty()) return KDN_OK;
  auto in = c.alloc_payload(uint32_t(live.size() * 8));
  if (!in.ok()) return rc(in.status());
  std::memcpy(c.payload_ptr(*in), live.data(), live.size() * 8);
  Request r;
  r.sqe.opcode = uint8_t(op);
  r.in = *in;
  r.sqe.in_len = uint32_t(live.size() * 8);
  auto cqe = c.call(r);
  c.free_payload(*in);
  if (!cqe.ok()) return rc(cqe.status());
  if (cqe->status != KDN_OK) return cqe->status;
  // COMMIT, ABORT and RELEASE share one shape: how many of the handles were finished.
  return rc(kdn::ipc::ReleaseOp::result(*cqe, uint32_t(live.size())).status());
}

kdn::kernels::ChunkGeometry geometry(const kdn_model& m) {
  kdn::kernels::ChunkGeometry g;
  g.layers = m.info.desc.num_layers;
  g.kv_heads = m.info.desc.num_kv_heads;
  g.head_dim = m.info.desc.head_dim;
  g.tokens = m.info.chunk_tokens;
  g.dtype = kdn::kernels::DType(m.info.desc.dtype);
  return g;
}

kdn_stats to_abi(const kdn::ipc::StatsRecord& s) {
  kdn_stats o{};
  o.struct_size = sizeof o;
  o.lookups = s.lookups;
  o.lookup_hit_chunks = s.lookup_hit_chunks;
  o.lookup_miss_chunks = s.lookup_miss_chunks;
  o.stored_chunks = s.stored_chunks;
  o.stored_bytes = s.stored_bytes;
  o.retrieved_chunks = s.retrieved_chunks;
  o.retrieved_bytes = s.retrieved_bytes;
  o.evicted_chunks = s.evicted_chunks;
  o.dropped_chunks = s.dropped_chunks;
  o.demoted_chunks = s.demoted_chunks;
  o.promoted_chunks = s.promoted_chunks;
  const uint32_t host = uint32_t(kdn::ipc::ChunkTier::kHost);
  o.resident_chunks = s.resident_chunks[host];
  o.resident_bytes = s.resident_bytes[host];
  o.capacity_bytes = s.capacity_bytes[host];
  for (uint32_t t = 0; t < KDN_TIER_COUNT; ++t) {
    o.tier_resident_chunks[t] = s.resident_chunks[t];
    o.tier_resident_bytes[t] = s.resident_bytes[t];
    o.tier_capacity_bytes[t] = s.capacity_bytes[t];
  }
  o.active_leases = s.active_leases;
  o.open_reservations = s.open_reservations;
  o.in_flight_ops = s.in_flight_ops;
  o.sessions = s.sessions;
  o.protocol_errors = s.protocol_errors;
  o.limit_errors = s.limit_errors;
  o.corrupt_chunks = s.corrupt_chunks;
  o.expired_reservations = s.expired_reservations;
  o.staging_bytes = s.staging_bytes;
  o.daemon_sessions = s.daemon_sessions;
  o.daemon_requests = s.daemon_requests;
  o.daemon_handshakes_refused = s.daemon_handshakes_refused;
  o.daemon_namespaces = s.daemon_namespaces;
  o.host_prefault_left_bytes = s.host_prefault_left_bytes;
  return o;
}

}  // namespace

extern "C" {

KDN_API int kdn_lookup(kdn_client* client, const kdn_model* model, const int32_t* tokens, size_t n_tokens,
                       kdn_lookup_result* out) {
  if (int e = check_model_call(client, model, tokens, n_tokens); e || !out) return e ? e : KDN_ERR_INVALID_ARGUMENT;
  return guarded([&]() -> int {
    *out = kdn_lookup_result{};
    if (n_tokens < model->info.chunk_tokens) return int(KDN_OK);  // no whole chunk: a miss
    Client& c = client_of(client);
    Request r;
    r.sqe.opcode = uint8_t(Opcode::kLookup);
    auto k = build_key_request(c, *model, tokens, n_tokens, 0, 0, 0, r);
    if (!k.ok()) return rc(k.status());
    auto cqe = c.call(r);
    c.free_payload(r.in);
    c.free_payload(r.out);
    if (!cqe.ok()) return rc(cqe.status());
    if (cqe->status != KDN_OK) return int(cqe->status);
    return fill_lookup(*cqe, *k, model->info.chunk_tokens, out);
  });
}

KDN_API int kdn_lookup_keys(kdn_client* client, const kdn_model* model, const kdn_key* keys, size_t n_keys,
                            kdn_lookup_result* out) {
  if (int e = check_model_call(client, model, nullptr, 0); e || !out || (!keys && n_keys))
    return e ? e : KDN_ERR_INVALID_ARGUMENT;
  if (n_keys > kdn::ipc::kMaxKeysPerOp) n_keys = kdn::ipc::kMaxKeysPerOp;
  return guarded([&]() -> int {
    *out = kdn_lookup_result{};
    if (n_keys == 0) return KDN_OK;
    Client& c = client_of(client);
    const uint32_t bytes = uint32_t(n_keys * sizeof(kdn_key));
    auto in = c.alloc_payload(bytes);
    if (!in.ok()) return rc(in.status());
    std::memcpy(c.payload_ptr(*in), keys, bytes);
    Request r;
    r.sqe.opcode = uint8_t(Opcode::kLookup);
    r.sqe.model_id = model->id;
    r.in = *in;
    r.sqe.in_len = bytes;
    auto cqe = c.call(r);
    c.free_payload(*in);
    if (!cqe.ok()) return rc(cqe.status());
    if (cqe->status != KDN_OK) return cqe->status;
    return fill_lookup(*cqe, uint32_t(n_keys), model->info.chunk_tokens, out);
  });
}

KDN_API int kdn_retrieve_lease(kdn_client* client, const kdn_model* model, const int32_t* tokens, size_t n_tokens,
                               uint32_t max_chunks, kdn_lease** out) {
  if (int e = check_model_call(client, model, tokens, n_tokens); e || !out) return e ? e : KDN_ERR_INVALID_ARGUMENT;
  *out = nullptr;
  return guarded([&]() -> int {
    auto lease = std::make_unique<kdn_lease>();
    lease->model = model;
    lease->owner = &client_of(client);
    if (n_tokens >= model->info.chunk_tokens) {
      Client& c = client_of(client);
      using Op = kdn::ipc::LeaseOp;
      Request r;
      r.sqe.opcode = uint8_t(Op::kOpcode);
      auto k = build_key_request(c, *model, tokens, n_tokens, 0, max_chunks, sizeof(Op::OutRecord), r);
      if (!k.ok()) return rc(k.status());
      Op::put(Op::Args{model->id, *k}, r.sqe);
      std::vector<Op::OutRecord> slots;
      auto cqe = call_for_records(c, r, *k, 0, &slots);
      if (!cqe.ok()) return rc(cqe.status());
      if (cqe->status != KDN_OK) return int(cqe->status);
      for (const auto& s : slots) lease->ids.push_back(s.lease_id);
      for (const auto& s : slots) {
        // Leased bytes are the arena's, mapped read-only: no engine can change them.
        auto p = c.resolve(s.slot, model->info.chunk_bytes, kdn::ipc::RegionKind::kHostArena);
        if (!p.ok() || s.lease_id == 0) {
          (void)release_ids(c, Opcode::kRelease, lease->ids);
          return int(KDN_ERR_PROTOCOL);
        }
        lease->data.push_back(*p);
      }
    }
    hold(client, lease->owner);
    *out = lease.release();
    return int(KDN_OK);
  });
}

KDN_API void kdn_copy_chunk(void* dst, const void* src, size_t bytes) {
  if (!dst || !src || bytes == 0) return;
  kdn::kernels::detail::copy_bytes(dst, src, bytes, bytes >= (1u << 20));
  kdn::kernels::detail::streaming_fence();
}

KDN_API uint32_t kdn_lease_chunks(const kdn_lease* l) { return l ? uint32_t(l->data.size()) : 0; }
KDN_API const void* kdn_lease_chunk_data(const kdn_lease* l, uint32_t i) {
  return l && i < l->data.size() ? l->data[i] : nullptr;
}

KDN_API int kdn_lease_release(kdn_client* client, kdn_lease* lease) {
  if (!client || !lease) return KDN_ERR_INVALID_ARGUMENT;
  std::unique_ptr<kdn_lease> owned(lease);
  int status = KDN_OK;  // a lease of a replaced connection: kdnd dropped it with that session
  if (!client->c)
    status = KDN_ERR_UNAVAILABLE;
  else if (lease->owner == client->c.get())
    status = client->c->broken()
                 ? int(KDN_ERR_UNAVAILABLE)  // the daemon drops them with us
                 : guarded([&]() -> int { return release_ids(client_of(client), Opcode::kRelease, lease->ids); });
  let_go(client, lease->owner);
  return status;
}

KDN_API int kdn_store_reserve(kdn_client* client, const kdn_model* model, const int32_t* tokens, size_t n_tokens,
                              uint32_t first_chunk, uint32_t n_chunks, kdn_store** out) {
  if (int e = check_model_call(client, model, tokens, n_tokens); e || !out) return e ? e : KDN_ERR_INVALID_ARGUMENT;
  *out = nullptr;
  if (n_chunks == 0) return KDN_ERR_INVALID_ARGUMENT;
  return guarded([&]() -> int {
    Client& c = client_of(client);
    const uint64_t whole = n_tokens / model->info.chunk_tokens;
    if (uint64_t(first_chunk) + n_chunks > whole) return int(KDN_ERR_INVALID_ARGUMENT);
    using Op = kdn::ipc::ReserveOp;
    Request r;
    r.sqe.opcode = uint8_t(Op::kOpcode);
    auto k = build_key_request(c, *model, tokens, n_tokens, first_chunk, n_chunks, sizeof(Op::OutRecord), r);
    if (!k.ok()) return rc(k.status());
    std::vector<Op::OutRecord> slots;
    auto cqe = call_for_records(c, r, *k, 1, &slots);  // res1: records served
    if (!cqe.ok()) return rc(cqe.status());
    if (cqe->status != KDN_OK) return int(cqe->status);
    if (!Op::result(*cqe, *k).ok()) return int(KDN_ERR_PROTOCOL);
    auto st = std::make_unique<kdn_store>();
    st->model = model;
    st->owner = &c;
    st->data.assign(*k, nullptr);
    st->reservation.assign(*k, 0);
    bool bad = false;
    for (size_t i = 0; i < slots.size(); ++i) {
      if (slots[i].state != uint32_t(kdn::ipc::ReserveState::kReserved)) continue;
      st->reservation[i] = slots[i].reservation_id;
      // A reserved slot lies in this client's own staging area, the one place it writes.
      auto p = c.resolve(slots[i].slot, model->info.chunk_bytes, kdn::ipc::RegionKind::kStaging);
      if (!p.ok() || !slots[i].reservation_id)
        bad = true;
      else
        st->data[i] = *p;
    }
    if (bad) {
      (void)release_ids(c, Opcode::kAbort, st->reservation);
      return int(KDN_ERR_PROTOCOL);
    }
    hold(client, st->owner);
    *out = st.release();
    return int(KDN_OK);
  });
}

KDN_API uint32_t kdn_store_chunks(const kdn_store* s) { return s ? uint32_t(s->data.size()) : 0; }
KDN_API void* kdn_store_chunk_data(kdn_store* s, uint32_t i) { return s && i < s->data.size() ? s->data[i] : nullptr; }

static int finish_store(kdn_client* client, kdn_store* store, Opcode op) {
  if (!client || !store) return KDN_ERR_INVALID_ARGUMENT;
  std::unique_ptr<kdn_store> owned(store);
  int status;
  if (!client->c || client->c->broken())
    status = KDN_ERR_UNAVAILABLE;
  else if (store->owner != client->c.get())  // a replaced connection: the reservation is gone
    status = op == Opcode::kAbort ? int(KDN_OK) : int(KDN_ERR_UNAVAILABLE);
  else
    status = guarded([&]() -> int { return release_ids(client_of(client), op, store->reservation); });
  let_go(client, store->owner);
  return status;
}

KDN_API int kdn_store_commit(kdn_client* client, kdn_store* store) {
  return finish_store(client, store, Opcode::kCommit);
}
KDN_API int kdn_store_abort(kdn_client* client, kdn_store* store) {
  return finish_store(client, store, Opcode::kAbort);
}

KDN_API int kdn_store_from(kdn_client* client, const kdn_model* model, const int32_t* tokens, size_t n_tokens,
                           uint32_t first_chunk, uint32_t n_chunks, const kdn_engine_layout* src, uint32_t* stored) {
  if (stored) *stored = 0;
  if (!src) return KDN_ERR_INVALID_ARGUMENT;
  const auto geo = model ? geometry(*model) : kdn::kernels::ChunkGeometry{};
  kdn::kernels::EngineView view;
  if (model) {
    Status vs = kdn::kernels::view_from_abi(*src, geo, {}, &view);
    if (!vs.ok()) return rc(vs);
  }
  // In rounds of what the staging area holds: each round reserves, gathers, commits.
  const uint32_t round = kdn_store_max_chunks(client, model);
  if (round == 0) return model && client ? KDN_ERR_LIMIT : KDN_ERR_INVALID_ARGUMENT;
  uint32_t written = 0;
  for (uint32_t done = 0; done < n_chunks;) {
    const uint32_t n = std::min(round, n_chunks - done);
    kdn_store* st = nullptr;
    int e = kdn_store_reserve(client, model, tokens, n_tokens, first_chunk + done, n, &st);
    if (e) return e;
    for (uint32_t i = 0; i < st->data.size(); ++i) {
      if (!st->data[i]) continue;
      view.first_token = int64_t(done + i) * model->info.chunk_tokens;
      Status g = kdn::kernels::gather(view, st->data[i], geo, kdn::kernels::Executor::cpu());
      if (!g.ok()) {
        (void)kdn_store_abort(client, st);
        return rc(g);
      }
      ++written;
    }
    e = kdn_store_commit(client, st);
    if (e != KDN_OK) return e;
    done += n;
  }
  if (stored) *stored = written;
  return KDN_OK;
}

KDN_API int kdn_retrieve_to(kdn_client* client, const kdn_model* model, const int32_t* tokens, size_t n_tokens,
                            uint32_t max_chunks, const kdn_engine_layout* dst, uint32_t* loaded_chunks) {
  if (loaded_chunks) *loaded_chunks = 0;
  if (!dst || !loaded_chunks) return KDN_ERR_INVALID_ARGUMENT;
  const auto geo = model ? geometry(*model) : kdn::kernels::ChunkGeometry{};
  kdn::kernels::EngineView view;
  if (model) {
    Status vs = kdn::kernels::view_from_abi(*dst, geo, {}, &view);
    if (!vs.ok()) return rc(vs);
  }
  kdn_lease* lease = nullptr;
  int e = kdn_retrieve_lease(client, model, tokens, n_tokens, max_chunks, &lease);
  if (e) return e;
  for (uint32_t i = 0; i < lease->data.size(); ++i) {
    view.first_token = int64_t(i) * model->info.chunk_tokens;
    Status s = kdn::kernels::scatter(lease->data[i], geo, view, kdn::kernels::Executor::cpu());
    if (!s.ok()) {
      (void)kdn_lease_release(client, lease);
      return rc(s);
    }
  }
  const uint32_t n = uint32_t(lease->data.size());
  e = kdn_lease_release(client, lease);
  if (e == KDN_OK) *loaded_chunks = n;
  return e;
}

KDN_API int kdn_lookup_post(kdn_client* client, const kdn_model* model, const int32_t* tokens, size_t n_tokens,
                            kdn_op** out) {
  if (int e = check_model_call(client, model, tokens, n_tokens); e || !out) return e ? e : KDN_ERR_INVALID_ARGUMENT;
  *out = nullptr;
  return guarded([&]() -> int {
    auto op = std::make_unique<kdn_op>();
    op->chunk_tokens = model->info.chunk_tokens;
    op->owner = &client_of(client);
    if (n_tokens < model->info.chunk_tokens) {
      op->complete = true;
      op->status = KDN_OK;
    } else {
      Client& c = client_of(client);
      Request r;
      r.sqe.opcode = uint8_t(Opcode::kLookup);
      auto k = build_key_request(c, *model, tokens, n_tokens, 0, 0, 0, r);
      if (!k.ok()) return rc(k.status());
      auto ud = c.post(r);
      if (!ud.ok()) {
        c.free_payload(r.in);
        return rc(ud.status());
      }
      op->user_data = *ud;
      op->in = r.in;
      op->keys = *k;
    }
    hold(client, op->owner);
    *out = op.release();
    return int(KDN_OK);
  });
}

static int complete_op(kdn_op* op) {
  Client& c = *op->owner;
  kdn::ipc::Cqe cqe = c.take(op->user_data);
  c.free_payload(op->in);
  op->complete = true;
  op->status = cqe.status;
  if (cqe.status != KDN_OK) return op->status;
  if (op->kind == kdn_op::Kind::kLookup)
    op->status = fill_lookup(cqe, op->keys, op->chunk_tokens, &op->lookup);
  else
    op->status = rc(kdn::ipc::CommitOp::result(cqe, op->keys).status());
  return op->status;
}

KDN_API int kdn_store_commit_post(kdn_client* client, kdn_store* store, kdn_op** out) {
  if (!client || !store || !out) return KDN_ERR_INVALID_ARGUMENT;
  *out = nullptr;
  std::unique_ptr<kdn_store> owned(store);
  struct LetGo {
    kdn_client* client;
    Client* owner;
    ~LetGo() { let_go(client, owner); }
  } let_store_go{client, store->owner};
  if (!client->c || client->c->broken() || store->owner != client->c.get()) return KDN_ERR_UNAVAILABLE;
  return guarded([&]() -> int {
    Client& c = client_of(client);
    auto op = std::make_unique<kdn_op>();
    op->kind = kdn_op::Kind::kCommit;
    op->owner = &c;
    std::vector<uint64_t> live;
    for (uint64_t id : store->reservation)
      if (id) live.push_back(id);
    if (live.empty()) {  // nothing was reserved: done at once
      op->complete = true;
      op->status = KDN_OK;
      hold(client, op->owner);
      *out = op.release();
      return int(KDN_OK);
    }
    const uint32_t bytes = uint32_t(live.size() * sizeof(uint64_t));
    auto in = c.alloc_payload(bytes);
    if (!in.ok()) return rc(in.status());
    std::memcpy(c.payload_ptr(*in), live.data(), bytes);
    Request r;
    r.sqe.opcode = uint8_t(Opcode::kCommit);
    r.in = *in;
    r.sqe.in_len = bytes;
    auto ud = c.post(r);
    if (!ud.ok()) {
      c.free_payload(*in);
      return rc(ud.status());
    }
    op->user_data = *ud;
    op->in = *in;
    op->keys = uint32_t(live.size());
    hold(client, op->owner);
    *out = op.release();
    return int(KDN_OK);
  });
}

KDN_API int kdn_op_poll(kdn_client* client, kdn_op* op) {
  if (!client || !client->c || !op) return KDN_ERR_INVALID_ARGUMENT;
  if (op->complete) return op->status;
  if (op->owner != client->c.get()) return KDN_ERR_UNAVAILABLE;  // its connection was replaced
  return guarded([&]() -> int {
    auto p = op->owner->poll(op->user_data);
    if (!p.ok()) return rc(p.status());
    return *p ? complete_op(op) : int(KDN_ERR_IN_PROGRESS);
  });
}

KDN_API int kdn_op_wait(kdn_client* client, kdn_op* op, uint32_t timeout_ms) {
  if (!client || !client->c || !op) return KDN_ERR_INVALID_ARGUMENT;
  if (op->complete) return op->status;
  if (op->owner != client->c.get()) return KDN_ERR_UNAVAILABLE;
  return guarded([&]() -> int {
    Status st = op->owner->wait(op->user_data, timeout_ms);
    if (!st.ok()) return rc(st);
    return complete_op(op);
  });
}

KDN_API int kdn_op_lookup_result(const kdn_op* op, kdn_lookup_result* out) {
  if (!op || !out) return KDN_ERR_INVALID_ARGUMENT;
  if (!op->complete) return KDN_ERR_IN_PROGRESS;
  if (op->status != KDN_OK) return op->status;
  *out = op->lookup;
  return KDN_OK;
}

KDN_API void kdn_op_release(kdn_client* client, kdn_op* op) {
  if (!op) return;
  if (client && client->c && op->owner == client->c.get() && !op->complete && !client->c->broken()) {
    // Its payload may still be written by the daemon: wait, or retire the connection.
    if (kdn_op_wait(client, op, 0) == KDN_ERR_TIMEOUT) client->c->mark_broken();
  }
  Client* owner = op->owner;
  delete op;
  if (client) let_go(client, owner);
}

KDN_API int kdn_prefetch(kdn_client* client, const kdn_model* model, const int32_t* tokens, size_t n_tokens) {
  if (int e = check_model_call(client, model, tokens, n_tokens); e) return e;
  if (n_tokens < model->info.chunk_tokens) return KDN_OK;  // no whole chunk: nothing to bring
  return guarded([&]() -> int {
    Client& c = client_of(client);
    if (c.welcome().proto_minor < 1) return int(KDN_ERR_UNSUPPORTED);  // a kdnd from before PREFETCH
    Request r;
    r.sqe.opcode = uint8_t(Opcode::kPrefetch);
    auto k = build_key_request(c, *model, tokens, n_tokens, 0, 0, 0, r);
    if (!k.ok()) return rc(k.status());
    Status st = c.post_detached(r);  // kdnd answers at once; the answer is reaped by a later call
    if (!st.ok()) c.free_payload(r.in);
    return rc(st);
  });
}

KDN_API int kdn_get_stats(kdn_client* client, kdn_stats* out) {
  if (!client || !client->c || !out || out->struct_size != sizeof(kdn_stats)) return KDN_ERR_INVALID_ARGUMENT;
  if (!reconnect_if_needed(client)) return KDN_ERR_UNAVAILABLE;
  return guarded([&]() -> int {
    using Op = kdn::ipc::StatsOp;
    constexpr uint32_t kWords = sizeof(kdn::ipc::StatsRecord) / sizeof(uint64_t);
    Client& c = client_of(client);
    auto o = c.alloc_payload(sizeof(kdn::ipc::StatsRecord));
    if (!o.ok()) return rc(o.status());
    Request r;
    r.sqe.opcode = uint8_t(Op::kOpcode);
    r.out = *o;
    r.sqe.out_len = sizeof(kdn::ipc::StatsRecord);
    auto cqe = c.call(r);
    kdn::ipc::StatsRecord s{};  // counters a daemon did not send stay zero
    int status = cqe.ok() ? cqe->status : rc(cqe.status());
    if (status == KDN_OK) {
      auto got = Op::result(*cqe, kWords);
      if (got.ok())
        std::memcpy(&s, c.payload_ptr(*o), got->words * sizeof(uint64_t));
      else
        status = rc(got.status());
    }
    c.free_payload(*o);
    if (status != KDN_OK) return status;
    *out = to_abi(s);
    return int(KDN_OK);
  });
}

}  // extern "C"
