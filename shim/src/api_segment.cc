// Segment entry points of the C ABI: keys, lookup, store from and retrieve to engine buffers.
// A segment's chunks are ordinary chunks in kdnd under their own keys; what is particular to
// segments lives here: the keys, the per-chunk hit map (LOOKUP_EACH), leases that do not stop at
// a miss (LEASE_EACH), partial last chunks and the rotation to the target position.
#include "handles.h"
#include "segment_plan.h"

#include <kdn/common/model.h>
#include <kdn/ipc/payload.h>
#include <kdn/kernels/layout.h>
#include <kdn/kernels/segment.h>

#include <algorithm>
#include <cstring>

using kdn::Code;
using kdn::Status;
using kdn::ipc::Opcode;
using namespace kdn::shim;

namespace kdn::shim {

Status check_segment(const kdn_segment* s) {
  if (s == nullptr || s->struct_size != sizeof(kdn_segment))
    return Status(Code::kInvalidArgument, "segment: struct_size does not match this library");
  if (s->reserved != 0) return Status(Code::kInvalidArgument, "segment: reserved field is not zero");
  if (s->n_tokens == 0 || s->n_tokens > KDN_SEGMENT_MAX_TOKENS || s->tokens == nullptr)
    return Status(Code::kInvalidArgument, "segment: n_tokens must be 1 .. KDN_SEGMENT_MAX_TOKENS with tokens");
  if (s->base_pos < 0 || s->base_pos > KDN_MAX_POSITION)
    return Status(Code::kInvalidArgument, "segment: base_pos out of range");
  return kdn::OkStatus();
}

// Validates the segments and computes every chunk key, in order (at most one request's worth).
Status plan_keys(const kdn::ModelInfo& m, const kdn_segment* segs, size_t n, std::vector<SegmentPlan>& plans,
                 std::vector<kdn_key>& keys) {
  if (segs == nullptr || n == 0) return Status(Code::kInvalidArgument, "segment: no segments");
  uint64_t total = 0;
  for (size_t i = 0; i < n; ++i) {
    KDN_RETURN_IF_ERROR(check_segment(&segs[i]));
    const uint64_t c = kdn::segment_chunks(m, segs[i].n_tokens);
    plans.push_back({&segs[i], total, c});
    total += c;
    if (total > kdn::ipc::kMaxKeysPerOp)
      return Status(Code::kInvalidArgument, "segment: more than 65,536 chunks in one call");
  }
  keys.resize(total);
  for (const SegmentPlan& p : plans) {
    const kdn_segment& s = *p.seg;
    kdn::segment_keys(m, s.base_key, s.base_pos, {s.tokens, size_t(s.n_tokens)}, {keys.data() + p.first_key, p.chunks});
  }
  return kdn::OkStatus();
}

Status check_targets(const kdn_segment* segs, size_t n, const int64_t* target, bool* moves) {
  bool moved = false;
  for (size_t s = 0; s < n; ++s) {  // the last token's position fits: no overflow below
    if (target[s] < 0 || target[s] > KDN_MAX_POSITION - int64_t(segs[s].n_tokens))
      return Status(Code::kInvalidArgument, "segment: target position out of range");
    moved = moved || target[s] != segs[s].base_pos;
  }
  if (moves) *moves = moved;
  return OkStatus();
}

}  // namespace kdn::shim

namespace {

kdn::kernels::ChunkGeometry geometry(const kdn_model& m) {
  return {m.info.desc.num_layers, m.info.desc.num_kv_heads, m.info.desc.head_dim, m.info.chunk_tokens,
          kdn::kernels::DType(m.info.desc.dtype)};
}

// Copies `keys` into a new request's input with room for one `out_record` per key.
Status key_request(Client& c, uint32_t model_id, const std::vector<kdn_key>& keys, uint32_t out_record, Request& r) {
  const uint32_t in_bytes = uint32_t(keys.size() * sizeof(kdn_key));
  auto in = c.alloc_payload(in_bytes);
  if (!in.ok()) return in.status();
  auto out = c.alloc_payload(uint32_t(keys.size()) * out_record);
  if (!out.ok()) {
    c.free_payload(*in);
    return out.status();
  }
  std::memcpy(c.payload_ptr(*in), keys.data(), in_bytes);
  r.in = *in;
  r.out = *out;
  r.sqe.model_id = model_id;
  r.sqe.in_len = in_bytes;
  r.sqe.out_len = uint32_t(keys.size()) * out_record;
  return kdn::OkStatus();
}

int release_leases(Client& c, const std::vector<uint64_t>& ids) {
  std::vector<uint64_t> live;
  for (uint64_t id : ids)
    if (id) live.push_back(id);
  if (live.empty()) return KDN_OK;
  const uint32_t bytes = uint32_t(live.size() * sizeof(uint64_t));
  auto in = c.alloc_payload(bytes);
  if (!in.ok()) return rc(in.status());
  std::memcpy(c.payload_ptr(*in), live.data(), bytes);
  Request r;
  r.sqe.opcode = uint8_t(Opcode::kRelease);
  r.in = *in;
  r.sqe.in_len = bytes;
  auto cqe = c.call(r);
  c.free_payload(*in);
  if (!cqe.ok()) return rc(cqe.status());
  if (cqe->status != KDN_OK) return cqe->status;
  return rc(kdn::ipc::ReleaseOp::result(*cqe, uint32_t(live.size())).status());
}

// The leases of one LEASE_EACH: lease ids (0 for a miss) and the chunks' bytes.
struct EachLease {
  std::vector<uint64_t> ids;
  std::vector<const void*> data;
};

int lease_each(Client& c, const kdn_model& m, const std::vector<kdn_key>& keys, EachLease& out) {
  using Op = kdn::ipc::LeaseEachOp;
  if (c.welcome().proto_minor < 2) return int(KDN_ERR_UNSUPPORTED);  // a kdnd from before LEASE_EACH
  Request r;
  r.sqe.opcode = uint8_t(Op::kOpcode);
  if (Status st = key_request(c, m.id, keys, sizeof(Op::OutRecord), r); !st.ok()) return rc(st);
  Op::put(Op::Args{m.id}, r.sqe);
  auto cqe = c.call(r);
  c.free_payload(r.in);
  std::vector<Op::OutRecord> recs;
  if (cqe.ok() && cqe->status == KDN_OK) {
    recs.resize(keys.size());
    std::memcpy(recs.data(), c.payload_ptr(r.out), keys.size() * sizeof(Op::OutRecord));
  }
  c.free_payload(r.out);
  if (!cqe.ok()) return rc(cqe.status());
  if (cqe->status != KDN_OK) return cqe->status;
  auto got = Op::result(*cqe, uint32_t(keys.size()));
  out.ids.assign(keys.size(), 0);
  out.data.assign(keys.size(), nullptr);
  uint32_t leased = 0;
  for (size_t i = 0; i < recs.size(); ++i) {
    out.ids[i] = recs[i].lease_id;
    if (recs[i].lease_id == 0) continue;
    ++leased;
    // Leased bytes are the arena's, mapped read-only: no engine can change them.
    auto p = c.resolve(recs[i].slot, m.info.chunk_bytes, kdn::ipc::RegionKind::kHostArena);
    if (p.ok())
      out.data[i] = *p;
    else
      got = p.status();
  }
  if (got.ok() && got->leased != leased) got = Status(Code::kProtocol, "LEASE_EACH count does not match its records");
  if (!got.ok()) {
    (void)release_leases(c, out.ids);
    return int(KDN_ERR_PROTOCOL);
  }
  return KDN_OK;
}

// Scatters the leading leased chunks of each segment; loaded[s] gets their tokens.
Status scatter_leased(const kdn_model& m, const std::vector<SegmentPlan>& plans, const EachLease& lease,
                      const int64_t* target, kdn::kernels::EngineView view, uint64_t* loaded, bool* whole) {
  const auto geo = geometry(m);
  float inv[kdn::kMaxHeadDim / 2];
  kdn::kernels::SegmentRope rope;
  const bool rotates = m.info.desc.rope_style != KDN_ROPE_NONE;
  if (rotates) KDN_RETURN_IF_ERROR(kdn::kernels::segment_rope_from_desc(m.info.desc, inv, kdn::kMaxHeadDim / 2, &rope));
  int64_t offset = 0;
  *whole = true;
  for (size_t s = 0; s < plans.size(); ++s) {
    const SegmentPlan& p = plans[s];
    uint64_t lead = 0;
    while (lead < p.chunks && lease.data[p.first_key + lead] != nullptr) ++lead;
    const uint64_t tokens = std::min<uint64_t>(p.seg->n_tokens, lead * m.info.chunk_tokens);
    if (tokens < p.seg->n_tokens) *whole = false;
    const int64_t delta = target[s] - p.seg->base_pos;
    if (delta != 0 && !rotates) return Status(Code::kUnsupported, "segment: moving KV needs a model with RoPE");
    if (tokens > 0) {
      view.first_token = offset;
      const std::span<const void* const> chunks(lease.data.data() + p.first_key, size_t(lead));
      KDN_RETURN_IF_ERROR(
          kdn::kernels::scatter_segment(chunks, tokens, geo, view, rope, delta, kdn::kernels::Executor::cpu()));
    }
    if (loaded) loaded[s] = tokens;
    offset += int64_t(p.seg->n_tokens);
  }
  return kdn::OkStatus();
}

}  // namespace

extern "C" {

KDN_API int kdn_context_key(const kdn_model_desc* desc, const int32_t* tokens, size_t n_tokens, kdn_key* out) {
  if (!desc || !out || (!tokens && n_tokens)) return KDN_ERR_INVALID_ARGUMENT;
  auto m = kdn::ModelInfo::from_desc(*desc);
  if (!m.ok()) return rc(m.status());
  *out = kdn::context_key(*m, {tokens, n_tokens});
  return KDN_OK;
}

KDN_API int kdn_segment_keys(const kdn_model_desc* desc, const kdn_segment* seg, kdn_key* keys, size_t max_keys,
                             size_t* n_keys) {
  if (!desc || !n_keys || (!keys && max_keys)) return KDN_ERR_INVALID_ARGUMENT;
  *n_keys = 0;
  if (Status st = check_segment(seg); !st.ok()) return rc(st);
  auto m = kdn::ModelInfo::from_desc(*desc);
  if (!m.ok()) return rc(m.status());
  *n_keys = kdn::segment_keys(*m, seg->base_key, seg->base_pos, {seg->tokens, size_t(seg->n_tokens)}, {keys, max_keys});
  return KDN_OK;
}

KDN_API int kdn_segment_lookup(kdn_client* client, const kdn_model* model, const kdn_segment* segs, size_t n_segs,
                               kdn_segment_hits* hits, uint8_t* hit_map, size_t hit_map_len) {
  if (int e = check_model_call(client, model, nullptr, 0); e || !hits || !hit_map)
    return e ? e : KDN_ERR_INVALID_ARGUMENT;
  return guarded([&]() -> int {
    std::vector<SegmentPlan> plans;
    std::vector<kdn_key> keys;
    if (Status st = plan_keys(model->info, segs, n_segs, plans, keys); !st.ok()) return rc(st);
    if (hit_map_len < keys.size()) return int(KDN_ERR_INVALID_ARGUMENT);
    using Op = kdn::ipc::LookupEachOp;
    Client& c = client_of(client);
    if (c.welcome().proto_minor < 2) return int(KDN_ERR_UNSUPPORTED);  // a kdnd from before LOOKUP_EACH
    Request r;
    r.sqe.opcode = uint8_t(Op::kOpcode);
    if (Status st = key_request(c, model->id, keys, sizeof(Op::OutRecord), r); !st.ok()) return rc(st);
    Op::put(Op::Args{model->id}, r.sqe);
    auto cqe = c.call(r);
    c.free_payload(r.in);
    std::vector<uint8_t> recs;
    if (cqe.ok() && cqe->status == KDN_OK) {
      recs.resize(keys.size());
      std::memcpy(recs.data(), c.payload_ptr(r.out), keys.size());
    }
    c.free_payload(r.out);
    if (!cqe.ok()) return rc(cqe.status());
    if (cqe->status != KDN_OK) return int(cqe->status);
    if (auto got = Op::result(*cqe, recs.data(), uint32_t(recs.size())); !got.ok()) return rc(got.status());
    std::memcpy(hit_map, recs.data(), recs.size());
    for (size_t s = 0; s < plans.size(); ++s) {
      const SegmentPlan& p = plans[s];
      kdn_segment_hits h{};
      h.chunks = uint32_t(p.chunks);
      h.map_offset = uint32_t(p.first_key);
      bool leading = true;
      for (uint64_t i = 0; i < p.chunks; ++i) {
        const bool hit = recs[p.first_key + i] != KDN_SEGMENT_MISS;
        h.cached_chunks += hit;
        leading = leading && hit;
        h.leading_chunks += leading;
      }
      h.cached_tokens = std::min<uint64_t>(p.seg->n_tokens, uint64_t(h.leading_chunks) * model->info.chunk_tokens);
      hits[s] = h;
    }
    return int(KDN_OK);
  });
}

KDN_API int kdn_segment_store_from(kdn_client* client, const kdn_model* model, const kdn_segment* seg,
                                   const kdn_engine_layout* src, uint32_t* stored_chunks) {
  if (stored_chunks) *stored_chunks = 0;
  if (int e = check_model_call(client, model, nullptr, 0); e || !src) return e ? e : KDN_ERR_INVALID_ARGUMENT;
  return guarded([&]() -> int {
    std::vector<SegmentPlan> plans;
    std::vector<kdn_key> keys;
    if (Status st = plan_keys(model->info, seg, 1, plans, keys); !st.ok()) return rc(st);
    const auto geo = geometry(*model);
    kdn::kernels::EngineView view;
    if (Status vs = kdn::kernels::view_from_abi(*src, geo, {}, &view); !vs.ok()) return rc(vs);
    const uint32_t round = kdn_store_max_chunks(client, model);
    if (round == 0) return int(KDN_ERR_LIMIT);
    Client& c = client_of(client);
    const uint32_t t = model->info.chunk_tokens;
    uint32_t written = 0;
    // In rounds of what the staging area holds: reserve, gather, commit.
    for (size_t first = 0; first < keys.size();) {
      const size_t n = std::min<size_t>(round, keys.size() - first);
      using Op = kdn::ipc::ReserveOp;
      Request r;
      r.sqe.opcode = uint8_t(Op::kOpcode);
      const std::vector<kdn_key> part(keys.begin() + first, keys.begin() + first + n);
      if (Status st = key_request(c, model->id, part, sizeof(Op::OutRecord), r); !st.ok()) return rc(st);
      auto cqe = c.call(r);
      c.free_payload(r.in);
      std::vector<Op::OutRecord> recs(n);
      if (cqe.ok() && cqe->status == KDN_OK) std::memcpy(recs.data(), c.payload_ptr(r.out), n * sizeof(Op::OutRecord));
      c.free_payload(r.out);
      if (!cqe.ok()) return rc(cqe.status());
      if (cqe->status != KDN_OK) return int(cqe->status);
      if (!Op::result(*cqe, uint32_t(n)).ok()) return int(KDN_ERR_PROTOCOL);
      std::vector<void*> slots(n, nullptr);
      std::vector<uint64_t> ids(n, 0);
      bool bad = false;
      for (size_t i = 0; i < n; ++i) {
        if (recs[i].state != uint32_t(kdn::ipc::ReserveState::kReserved)) continue;
        ids[i] = recs[i].reservation_id;
        auto p = c.resolve(recs[i].slot, model->info.chunk_bytes, kdn::ipc::RegionKind::kStaging);
        if (!p.ok() || ids[i] == 0)
          bad = true;
        else
          slots[i] = *p;
      }
      Status g = bad ? Status(Code::kProtocol, "RESERVE answered a bad slot") : kdn::OkStatus();
      if (g.ok() && std::any_of(slots.begin(), slots.end(), [](void* p) { return p != nullptr; })) {
        kdn::kernels::EngineView v = view;
        v.first_token = int64_t(first) * t;
        const uint64_t tokens = std::min<uint64_t>(seg->n_tokens - uint64_t(first) * t, uint64_t(n) * t);
        g = kdn::kernels::gather_segment(v, slots, tokens, geo, kdn::kernels::Executor::cpu());
      }
      kdn_store st{&c, model, slots, ids};
      if (!g.ok()) {
        (void)kdn_store_abort(client, new kdn_store(std::move(st)));
        return rc(g);
      }
      if (int e = kdn_store_commit(client, new kdn_store(std::move(st))); e != KDN_OK) return e;
      for (void* p : slots) written += p != nullptr;
      first += n;
    }
    if (stored_chunks) *stored_chunks = written;
    return int(KDN_OK);
  });
}

KDN_API int kdn_segment_retrieve_to(kdn_client* client, const kdn_model* model, const kdn_segment* segs, size_t n_segs,
                                    const int64_t* target_pos, const kdn_engine_layout* dst, uint64_t* loaded_tokens) {
  if (int e = check_model_call(client, model, nullptr, 0); e || !dst || !target_pos)
    return e ? e : KDN_ERR_INVALID_ARGUMENT;
  return guarded([&]() -> int {
    std::vector<SegmentPlan> plans;
    std::vector<kdn_key> keys;
    if (Status st = plan_keys(model->info, segs, n_segs, plans, keys); !st.ok()) return rc(st);
    if (loaded_tokens) std::fill(loaded_tokens, loaded_tokens + n_segs, 0);
    if (Status st = check_targets(segs, n_segs, target_pos, nullptr); !st.ok()) return rc(st);
    kdn::kernels::EngineView view;
    if (Status vs = kdn::kernels::view_from_abi(*dst, geometry(*model), {}, &view); !vs.ok()) return rc(vs);
    Client& c = client_of(client);
    EachLease lease;
    if (int e = lease_each(c, *model, keys, lease); e != KDN_OK) return e;
    bool whole = false;
    Status st = scatter_leased(*model, plans, lease, target_pos, view, loaded_tokens, &whole);
    const int released = release_leases(c, lease.ids);
    if (!st.ok()) return rc(st);
    if (released != KDN_OK) return released;
    return whole ? int(KDN_OK) : int(KDN_ERR_NOT_FOUND);
  });
}

}  // extern "C"
