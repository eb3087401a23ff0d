// Data-path entry points of the C ABI: lookup, leases, reservations, copy variants, async
// ops and stats.
#include "handles.h"

#include <kdn/ipc/payload.h>
#include <kdn/kernels/layout.h>
#include <kdn/kernels/ops.h>
#include <kdn/kernels/stream_copy.h>

#include <cstring>
#include <new>

using kdn::Code;
using kdn::Status;
using kdn::ipc::Opcode;
using namespace kdn::shim;

namespace kdn::shim {

Result<uint32_t> build_key_request(Client& c, const kdn_model& m, const int32_t* tokens, size_t n,
                                   uint32_t first, uint32_t count, uint32_t out_record, Request& r) {
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

void fill_lookup(const kdn::ipc::Cqe& c, uint32_t chunk_tokens, kdn_lookup_result* out) {
  *out = kdn_lookup_result{};
  out->hit_chunks = uint32_t(c.res[0]);
  out->hit_tokens = uint64_t(out->hit_chunks) * chunk_tokens;
  for (uint32_t t = 0; t < KDN_TIER_COUNT; ++t) out->tier_chunks[t] = uint32_t(c.res[1 + t]);
}

// A daemon-supplied arena offset must name a whole chunk inside the mapped arena.
bool arena_range_ok(Client& c, uint64_t off, uint64_t bytes) {
  return kdn::ipc::range_ok(off, bytes, c.arena_bytes());
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
  return cqe->status;
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

}  // namespace

extern "C" {

KDN_API int kdn_lookup(kdn_client* client, const kdn_model* model, const int32_t* tokens,
                       size_t n_tokens, kdn_lookup_result* out) {
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
    if (cqe->res[0] > *k) return int(KDN_ERR_PROTOCOL);
    fill_lookup(*cqe, model->info.chunk_tokens, out);
    return int(KDN_OK);
  });
}

KDN_API int kdn_lookup_keys(kdn_client* client, const kdn_model* model, const kdn_key* keys,
                            size_t n_keys, kdn_lookup_result* out) {
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
    if (cqe->res[0] > n_keys) return KDN_ERR_PROTOCOL;
    fill_lookup(*cqe, model->info.chunk_tokens, out);
    return KDN_OK;
  });
}

KDN_API int kdn_retrieve_lease(kdn_client* client, const kdn_model* model, const int32_t* tokens,
                               size_t n_tokens, uint32_t max_chunks, kdn_lease** out) {
  if (int e = check_model_call(client, model, tokens, n_tokens); e || !out) return e ? e : KDN_ERR_INVALID_ARGUMENT;
  *out = nullptr;
  return guarded([&]() -> int {
    auto lease = std::make_unique<kdn_lease>();
    lease->model = model;
    if (n_tokens >= model->info.chunk_tokens) {
      Client& c = client_of(client);
      Request r;
      r.sqe.opcode = uint8_t(Opcode::kLease);
      r.sqe.arg[0] = max_chunks;
      auto k = build_key_request(c, *model, tokens, n_tokens, 0, max_chunks, sizeof(kdn::ipc::LeaseSlot), r);
      if (!k.ok()) return rc(k.status());
      std::vector<kdn::ipc::LeaseSlot> slots;
      auto cqe = call_for_records(c, r, *k, 0, &slots);
      if (!cqe.ok()) return rc(cqe.status());
      if (cqe->status != KDN_OK) return int(cqe->status);
      for (const auto& s : slots) lease->ids.push_back(s.lease_id);
      for (const auto& s : slots) {
        if (!arena_range_ok(c, s.arena_off, model->info.chunk_bytes)) {
          (void)release_ids(c, Opcode::kRelease, lease->ids);
          return int(KDN_ERR_PROTOCOL);
        }
        lease->data.push_back(c.arena() + s.arena_off);
      }
    }
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
  if (!client->c || client->c->broken()) return KDN_ERR_UNAVAILABLE;  // the daemon drops them with us
  return guarded([&]() -> int { return release_ids(client_of(client), Opcode::kRelease, lease->ids); });
}

KDN_API int kdn_store_reserve(kdn_client* client, const kdn_model* model, const int32_t* tokens,
                              size_t n_tokens, uint32_t first_chunk, uint32_t n_chunks, kdn_store** out) {
  if (int e = check_model_call(client, model, tokens, n_tokens); e || !out) return e ? e : KDN_ERR_INVALID_ARGUMENT;
  *out = nullptr;
  if (n_chunks == 0) return KDN_ERR_INVALID_ARGUMENT;
  return guarded([&]() -> int {
    Client& c = client_of(client);
    const uint64_t whole = n_tokens / model->info.chunk_tokens;
    if (uint64_t(first_chunk) + n_chunks > whole) return int(KDN_ERR_INVALID_ARGUMENT);
    Request r;
    r.sqe.opcode = uint8_t(Opcode::kReserve);
    auto k = build_key_request(c, *model, tokens, n_tokens, first_chunk, n_chunks,
                               sizeof(kdn::ipc::ReserveSlot), r);
    if (!k.ok()) return rc(k.status());
    std::vector<kdn::ipc::ReserveSlot> slots;
    auto cqe = call_for_records(c, r, *k, 1, &slots);  // res1: records written
    if (!cqe.ok()) return rc(cqe.status());
    if (cqe->status != KDN_OK) return int(cqe->status);
    auto st = std::make_unique<kdn_store>();
    st->model = model;
    st->data.assign(*k, nullptr);
    st->reservation.assign(*k, 0);
    bool bad = false;
    for (size_t i = 0; i < slots.size(); ++i) {
      if (slots[i].state != uint32_t(kdn::ipc::ReserveState::kReserved)) continue;
      st->reservation[i] = slots[i].reservation_id;
      if (!arena_range_ok(c, slots[i].arena_off, model->info.chunk_bytes) || !slots[i].reservation_id) bad = true;
      else st->data[i] = c.arena() + slots[i].arena_off;
    }
    if (bad) {
      (void)release_ids(c, Opcode::kAbort, st->reservation);
      return int(KDN_ERR_PROTOCOL);
    }
    *out = st.release();
    return int(KDN_OK);
  });
}

KDN_API uint32_t kdn_store_chunks(const kdn_store* s) { return s ? uint32_t(s->data.size()) : 0; }
KDN_API void* kdn_store_chunk_data(kdn_store* s, uint32_t i) {
  return s && i < s->data.size() ? s->data[i] : nullptr;
}

static int finish_store(kdn_client* client, kdn_store* store, Opcode op) {
  if (!client || !store) return KDN_ERR_INVALID_ARGUMENT;
  std::unique_ptr<kdn_store> owned(store);
  if (!client->c || client->c->broken()) return KDN_ERR_UNAVAILABLE;
  return guarded([&]() -> int { return release_ids(client_of(client), op, store->reservation); });
}

KDN_API int kdn_store_commit(kdn_client* client, kdn_store* store) {
  return finish_store(client, store, Opcode::kCommit);
}
KDN_API int kdn_store_abort(kdn_client* client, kdn_store* store) {
  return finish_store(client, store, Opcode::kAbort);
}

KDN_API int kdn_store_from(kdn_client* client, const kdn_model* model, const int32_t* tokens,
                           size_t n_tokens, uint32_t first_chunk, uint32_t n_chunks,
                           const kdn_engine_layout* src, uint32_t* stored) {
  if (stored) *stored = 0;
  if (!src) return KDN_ERR_INVALID_ARGUMENT;
  const auto geo = model ? geometry(*model) : kdn::kernels::ChunkGeometry{};
  kdn::kernels::EngineView view;
  if (model) {
    Status vs = kdn::kernels::view_from_abi(*src, geo, {}, &view);
    if (!vs.ok()) return rc(vs);
  }
  kdn_store* st = nullptr;
  int e = kdn_store_reserve(client, model, tokens, n_tokens, first_chunk, n_chunks, &st);
  if (e) return e;
  uint32_t written = 0;
  for (uint32_t i = 0; i < st->data.size(); ++i) {
    if (!st->data[i]) continue;
    view.first_token = int64_t(i) * model->info.chunk_tokens;
    Status g = kdn::kernels::gather(view, st->data[i], geo, kdn::kernels::Executor::cpu());
    if (!g.ok()) {
      (void)kdn_store_abort(client, st);
      return rc(g);
    }
    ++written;
  }
  e = kdn_store_commit(client, st);
  if (e == KDN_OK && stored) *stored = written;
  return e;
}

KDN_API int kdn_retrieve_to(kdn_client* client, const kdn_model* model, const int32_t* tokens,
                            size_t n_tokens, uint32_t max_chunks, const kdn_engine_layout* dst,
                            uint32_t* loaded_chunks) {
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

KDN_API int kdn_lookup_post(kdn_client* client, const kdn_model* model, const int32_t* tokens,
                            size_t n_tokens, kdn_op** out) {
  if (int e = check_model_call(client, model, tokens, n_tokens); e || !out) return e ? e : KDN_ERR_INVALID_ARGUMENT;
  *out = nullptr;
  return guarded([&]() -> int {
    auto op = std::make_unique<kdn_op>();
    op->chunk_tokens = model->info.chunk_tokens;
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
    }
    *out = op.release();
    return int(KDN_OK);
  });
}

static int complete_op(kdn_client* client, kdn_op* op) {
  Client& c = client_of(client);
  kdn::ipc::Cqe cqe = c.take(op->user_data);
  c.free_payload(op->in);
  op->complete = true;
  op->status = cqe.status;
  if (cqe.status == KDN_OK) fill_lookup(cqe, op->chunk_tokens, &op->lookup);
  return op->status;
}

KDN_API int kdn_op_poll(kdn_client* client, kdn_op* op) {
  if (!client || !client->c || !op) return KDN_ERR_INVALID_ARGUMENT;
  if (op->complete) return op->status;
  return guarded([&]() -> int {
    auto p = client_of(client).poll(op->user_data);
    if (!p.ok()) return rc(p.status());
    return *p ? complete_op(client, op) : int(KDN_ERR_IN_PROGRESS);
  });
}

KDN_API int kdn_op_wait(kdn_client* client, kdn_op* op, uint32_t timeout_ms) {
  if (!client || !client->c || !op) return KDN_ERR_INVALID_ARGUMENT;
  if (op->complete) return op->status;
  return guarded([&]() -> int {
    Status st = client_of(client).wait(op->user_data, timeout_ms);
    if (!st.ok()) return rc(st);
    return complete_op(client, op);
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
  if (client && client->c && !op->complete && !client->c->broken()) {
    // Its payload may still be written by the daemon: wait, or retire the connection.
    if (kdn_op_wait(client, op, 0) == KDN_ERR_TIMEOUT) client->c->mark_broken();
  }
  delete op;
}

KDN_API int kdn_get_stats(kdn_client* client, kdn_stats* out) {
  if (!client || !client->c || !out) return KDN_ERR_INVALID_ARGUMENT;
  if (client->c->broken()) return KDN_ERR_UNAVAILABLE;
  return guarded([&]() -> int {
    Client& c = client_of(client);
    auto o = c.alloc_payload(sizeof(kdn_stats));
    if (!o.ok()) return rc(o.status());
    Request r;
    r.sqe.opcode = uint8_t(Opcode::kStats);
    r.out = *o;
    r.sqe.out_len = sizeof(kdn_stats);
    auto cqe = c.call(r);
    if (cqe.ok() && cqe->status == KDN_OK) std::memcpy(out, c.payload_ptr(*o), sizeof(kdn_stats));
    c.free_payload(*o);
    if (!cqe.ok()) return rc(cqe.status());
    return int(cqe->status);
  });
}

}  // extern "C"
