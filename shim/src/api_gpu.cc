// The GPU engine API of kdn/kdn.h: registrations of device KV memory, and retrieves and stores
// whose copies kdnd runs on its own streams. libkdn needs no CUDA: it passes the engine's handle
// bytes; a VMM registration's fd is named by number and kdnd takes its own copy with
// pidfd_getfd from this process (docs/gpu.md).
#include "handles.h"
#include "segment_plan.h"

#include <kdn/ipc/gpu_layout.h>
#include <kdn/ipc/payload.h>
#include <kdn/kernels/layout.h>

#include <algorithm>
#include <cmath>
#include <cstring>

using kdn::Code;
using kdn::Status;
using kdn::ipc::Opcode;
using namespace kdn::shim;

struct kdn_gpu_kv {
  Client* owner = nullptr;  // the connection it was registered on
  kdn::ipc::GpuRegistrationRef ref;
  uint32_t device = 0;
  uint8_t done_event[KDN_GPU_HANDLE_BYTES] = {};
  uint64_t unchecked_first = 0, unchecked_last = 0;  // tickets of retrieves since the last kdn_gpu_check
};

namespace {

constexpr uint16_t kGpuMinor = 4;     // the first protocol minor with the GPU opcodes
constexpr uint16_t kTicketMinor = 5;  // GPU_BLEND_SELECT, GPU_CHECK and retrieve tickets

// A retrieve round queued copies under `ticket` (0: none, or a kdnd without tickets).
void note_ticket(kdn_gpu_kv& kv, uint64_t ticket) {
  if (ticket == 0) return;
  if (kv.unchecked_first == 0) kv.unchecked_first = ticket;
  kv.unchecked_last = std::max(kv.unchecked_last, ticket);
}

// The wire form of a layout for chunks [first, first + n): the slot of every token, written
// out (identity when the caller gave no mapping). `base_chunk` is the chunk whose token 0 is
// engine token 0 of the mapping.
kdn::Result<std::vector<std::byte>> layout_bytes(const kdn_model& m, const kdn_engine_layout& l,
                                                 const std::vector<int64_t>& slots);

kdn::Result<std::vector<std::byte>> layout_for(const kdn_model& m, const kdn_engine_layout& l, uint32_t first,
                                               uint32_t n, uint32_t base_chunk) {
  const uint64_t T = m.info.chunk_tokens;
  std::vector<int64_t> slots(uint64_t(n) * T);
  for (uint64_t i = 0; i < slots.size(); ++i) {
    const uint64_t t = (uint64_t(first) - base_chunk) * T + i;
    slots[i] = l.slot_mapping ? l.slot_mapping[t] : int64_t(t);
  }
  return layout_bytes(m, l, slots);
}

// The wire form of a layout whose slots are written out (kdn/ipc/gpu_layout.h).
kdn::Result<std::vector<std::byte>> layout_bytes(const kdn_model& m, const kdn_engine_layout& l,
                                                 const std::vector<int64_t>& slots) {
  return kdn::ipc::encode_gpu_layout(l, m.info.desc.num_layers, slots);
}

// Chunks one GPU request carries: its keys and its layout (and `extra` bytes per chunk: a
// segment retrieve's records and output) must fit half the payload area.
uint32_t chunks_per_request(const Client& c, const kdn_model& m, bool split, uint64_t extra = 0) {
  const uint64_t budget = c.welcome().payload_bytes / 2;
  const uint64_t fixed = sizeof(kdn::ipc::GpuLayoutRecord) + uint64_t(m.info.desc.num_layers) * 8 * (split ? 2 : 1);
  const uint64_t per_chunk = sizeof(kdn_key) + uint64_t(m.info.chunk_tokens) * 8 + extra;
  if (budget <= fixed) return 0;
  return uint32_t(std::min<uint64_t>(
      {(budget - fixed) / per_chunk, kdn::ipc::kMaxKeysPerOp, kdn::ipc::kGpuMaxLayoutBytes / per_chunk}));
}

// Common checks of a retrieve or store; KDN_OK or an error code.
int check_gpu_call(kdn_client* client, const kdn_model* model, const int32_t* tokens, size_t n_tokens,
                   const kdn_gpu_kv* kv, const kdn_engine_layout* layout) {
  if (int e = check_model_call(client, model, tokens, n_tokens)) return e;
  if (!kv || !layout || !layout->layer_base) return KDN_ERR_INVALID_ARGUMENT;
  if (kv->owner != client->c.get()) return KDN_ERR_UNAVAILABLE;  // registered before kdnd restarted
  kdn::kernels::ChunkGeometry g;
  g.layers = model->info.desc.num_layers;
  g.kv_heads = model->info.desc.num_kv_heads;
  g.head_dim = model->info.desc.head_dim;
  g.tokens = model->info.chunk_tokens;
  g.dtype = kdn::kernels::DType(model->info.desc.dtype);
  kdn::kernels::EngineView view;
  return rc(kdn::kernels::view_from_abi(*layout, g, {}, &view));  // the same checks as the host variants
}

// One GPU_RETRIEVE or GPU_STORE for keys[first, first + n); its CQE.
kdn::Result<kdn::ipc::Cqe> gpu_request(Client& c, Opcode op, const kdn_model& m, const kdn_gpu_kv& kv,
                                       const std::vector<kdn_key>& keys, uint32_t first, uint32_t n,
                                       uint32_t max_chunks, const std::vector<std::byte>& layout) {
  auto in = c.alloc_payload(n * uint32_t(sizeof(kdn_key)));
  if (!in.ok()) return in.status();
  auto lay = c.alloc_payload(uint32_t(layout.size()));
  if (!lay.ok()) {
    c.free_payload(*in);
    return lay.status();
  }
  std::memcpy(c.payload_ptr(*in), keys.data() + first, n * sizeof(kdn_key));
  std::memcpy(c.payload_ptr(*lay), layout.data(), layout.size());
  Request r;
  r.sqe.opcode = uint8_t(op);
  r.in = *in;
  r.sqe.in_len = n * uint32_t(sizeof(kdn_key));
  const kdn::ipc::GpuLayoutRef where{lay->off, uint32_t(layout.size())};
  if (op == Opcode::kGpuRetrieve)
    kdn::ipc::GpuRetrieveOp::put({m.id, kv.ref, max_chunks, where}, r.sqe);
  else
    kdn::ipc::GpuStoreOp::put({m.id, kv.ref, where}, r.sqe);
  auto cqe = c.call(r);
  c.free_payload(*in);
  c.free_payload(*lay);
  return cqe;
}

// One chunk of a segment retrieve: its segment, its index there, the engine token its row 0
// goes to (dst's mapping), the rows it holds and how far its K moves.
struct SegmentChunk {
  size_t seg;
  uint64_t index;
  uint64_t engine_token;
  uint32_t rows;
  int64_t delta;
};

std::vector<SegmentChunk> segment_chunks(const kdn_model& m, const std::vector<SegmentPlan>& plans,
                                         const int64_t* target) {
  const uint64_t T = m.info.chunk_tokens;
  std::vector<SegmentChunk> out;
  uint64_t offset = 0;  // segment s starts at engine token n_0 + ... + n_{s-1}
  for (size_t s = 0; s < plans.size(); ++s) {
    const kdn_segment& seg = *plans[s].seg;
    for (uint64_t i = 0; i < plans[s].chunks; ++i)
      out.push_back(
          {s, i, offset + i * T, uint32_t(std::min<uint64_t>(T, seg.n_tokens - i * T)), target[s] - seg.base_pos});
    offset += seg.n_tokens;
  }
  return out;
}

// The wire form of segment chunks `win` of `all`: each chunk's T slots in the layout (-1 past a
// segment's end), its record, its key.
struct SegmentWire {
  std::vector<std::byte> layout;
  std::vector<kdn::ipc::GpuSegmentChunkRecord> recs;
  std::vector<kdn_key> keys;
};

kdn::Result<SegmentWire> segment_wire(const kdn_model& m, const kdn_engine_layout& dst,
                                      const std::vector<SegmentChunk>& all, const std::vector<kdn_key>& keys,
                                      const std::vector<size_t>& win) {
  const uint32_t T = m.info.chunk_tokens, n = uint32_t(win.size());
  std::vector<int64_t> slots(uint64_t(n) * T, -1);
  SegmentWire w;
  w.recs.resize(n);
  w.keys.resize(n);
  for (uint32_t j = 0; j < n; ++j) {
    const SegmentChunk& ch = all[win[j]];
    for (uint32_t r = 0; r < ch.rows; ++r) {
      const uint64_t t = ch.engine_token + r;
      slots[uint64_t(j) * T + r] = dst.slot_mapping ? dst.slot_mapping[t] : int64_t(t);
    }
    w.recs[j] = {ch.delta, j * T, ch.index == 0 ? kdn::ipc::kGpuSegmentStart : 0u};
    w.keys[j] = keys[win[j]];
  }
  auto wire = layout_bytes(m, dst, slots);
  if (!wire.ok()) return wire.status();
  w.layout = std::move(*wire);
  return w;
}

// One request over segment chunks (GPU_SEGMENT_RETRIEVE, GPU_BLEND_SELECT): the keys as input,
// the records and the layout in the payload area, `out_bytes` of output copied to `out` when it
// succeeded. `put` encodes the SQE's scalars given where the records and the layout are.
template <class Put>
kdn::Result<kdn::ipc::Cqe> segment_call(Client& c, const SegmentWire& w, uint32_t out_bytes,
                                        std::vector<std::byte>& out, Put put) {
  const uint32_t key_bytes = uint32_t(w.keys.size() * sizeof(kdn_key));
  const uint32_t rec_bytes = uint32_t(w.recs.size() * sizeof(kdn::ipc::GpuSegmentChunkRecord));
  PayloadRange in{}, rp{}, lay{}, o{};
  auto free_all = [&] {
    for (PayloadRange* p : {&in, &rp, &lay, &o})
      if (p->len) c.free_payload(*p);
  };
  for (auto [ref, bytes] :
       {std::pair{&in, key_bytes}, {&rp, rec_bytes}, {&lay, uint32_t(w.layout.size())}, {&o, out_bytes}}) {
    auto a = c.alloc_payload(bytes);
    if (!a.ok()) {
      free_all();
      return a.status();
    }
    *ref = *a;
  }
  std::memcpy(c.payload_ptr(in), w.keys.data(), key_bytes);
  std::memcpy(c.payload_ptr(rp), w.recs.data(), rec_bytes);
  std::memcpy(c.payload_ptr(lay), w.layout.data(), w.layout.size());
  Request r;
  r.in = in;
  r.out = o;
  r.sqe.in_len = key_bytes;
  r.sqe.out_len = out_bytes;
  put(r.sqe, kdn::ipc::GpuLayoutRef{rp.off, rec_bytes}, kdn::ipc::GpuLayoutRef{lay.off, uint32_t(w.layout.size())});
  auto cqe = c.call(r);
  out.assign(out_bytes, std::byte{0});
  if (cqe.ok() && cqe->status == KDN_OK) std::memcpy(out.data(), c.payload_ptr(o), out_bytes);
  free_all();
  return cqe;
}

// One GPU_SEGMENT_RETRIEVE of the chunks `win`. `copied` gets the answer's byte per chunk.
kdn::Result<kdn::ipc::GpuSegmentRetrieveOp::Result> segment_request(Client& c, const kdn_model& m, const kdn_gpu_kv& kv,
                                                                    const kdn_engine_layout& dst,
                                                                    const std::vector<SegmentChunk>& all,
                                                                    const std::vector<kdn_key>& keys,
                                                                    const std::vector<size_t>& win,
                                                                    std::vector<uint8_t>& copied) {
  using Op = kdn::ipc::GpuSegmentRetrieveOp;
  auto w = segment_wire(m, dst, all, keys, win);
  if (!w.ok()) return w.status();
  const uint32_t n = uint32_t(win.size());
  std::vector<std::byte> out;
  auto cqe =
      segment_call(c, *w, n, out, [&](kdn::ipc::Sqe& q, kdn::ipc::GpuLayoutRef recs, kdn::ipc::GpuLayoutRef lay) {
        q.opcode = uint8_t(Op::kOpcode);
        Op::put({m.id, kv.ref, recs, lay}, q);
      });
  copied.assign(n, kdn::ipc::kGpuSegmentSkipped);
  if (!cqe.ok()) return cqe.status();
  if (cqe->status != KDN_OK) return Status(Code(cqe->status), "GPU_SEGMENT_RETRIEVE failed");
  std::memcpy(copied.data(), out.data(), n);
  return Op::result(*cqe, copied.data(), n);
}

}  // namespace

KDN_API int kdn_gpu_register(kdn_client* client, const kdn_gpu_kv_desc* desc, kdn_gpu_kv** out) {
  if (out) *out = nullptr;
  if (!client || !desc || !out) return KDN_ERR_INVALID_ARGUMENT;
  if (desc->struct_size < sizeof(kdn_gpu_kv_desc)) return KDN_ERR_VERSION;
  if (desc->kind != KDN_GPU_MEMORY_IPC && desc->kind != KDN_GPU_MEMORY_VMM_FD) return KDN_ERR_INVALID_ARGUMENT;
  if (desc->bytes == 0 || desc->reserved != 0) return KDN_ERR_INVALID_ARGUMENT;
  if (desc->kind == KDN_GPU_MEMORY_VMM_FD && desc->vmm_fd < 0) return KDN_ERR_INVALID_ARGUMENT;
  if (!reconnect_if_needed(client)) return KDN_ERR_UNAVAILABLE;
  return guarded([&]() -> int {
    Client& c = client_of(client);
    if (c.welcome().proto_minor < kGpuMinor) return int(KDN_ERR_UNSUPPORTED);  // a kdnd without the GPU tier
    kdn::ipc::GpuRegisterRecord rec{};
    rec.kind = desc->kind;
    rec.vmm_fd = desc->kind == KDN_GPU_MEMORY_VMM_FD ? desc->vmm_fd : -1;
    std::memcpy(rec.device_uuid, desc->device_uuid, sizeof rec.device_uuid);
    rec.engine_base = desc->engine_base;
    rec.bytes = desc->bytes;
    rec.alloc_offset = desc->alloc_offset;
    rec.alloc_bytes = desc->alloc_bytes;
    std::memcpy(rec.ipc_handle, desc->ipc_handle, sizeof rec.ipc_handle);
    std::memcpy(rec.engine_event, desc->engine_event, sizeof rec.engine_event);
    auto in = c.alloc_payload(sizeof rec);
    if (!in.ok()) return rc(in.status());
    auto o = c.alloc_payload(sizeof(kdn::ipc::GpuRegisteredRecord));
    if (!o.ok()) {
      c.free_payload(*in);
      return rc(o.status());
    }
    std::memcpy(c.payload_ptr(*in), &rec, sizeof rec);
    Request r;
    r.sqe.opcode = uint8_t(Opcode::kGpuRegister);
    r.in = *in;
    r.out = *o;
    r.sqe.in_len = sizeof rec;
    r.sqe.out_len = sizeof(kdn::ipc::GpuRegisteredRecord);
    auto cqe = c.call(r);
    kdn::ipc::GpuRegisteredRecord got{};
    if (cqe.ok() && cqe->status == KDN_OK) std::memcpy(&got, c.payload_ptr(*o), sizeof got);
    c.free_payload(*in);
    c.free_payload(*o);
    if (!cqe.ok()) return rc(cqe.status());
    if (cqe->status != KDN_OK) return int(cqe->status);
    auto res = kdn::ipc::GpuRegisterOp::result(*cqe);
    if (!res.ok() || got.registration != res->registration || got.generation != res->generation)
      return int(KDN_ERR_PROTOCOL);
    auto kv = std::make_unique<kdn_gpu_kv>();
    kv->owner = &c;
    kv->ref = {res->registration, res->generation};
    kv->device = res->device;
    std::memcpy(kv->done_event, got.done_event, sizeof kv->done_event);
    hold(client, kv->owner);
    *out = kv.release();
    return int(KDN_OK);
  });
}

KDN_API const uint8_t* kdn_gpu_kv_done_event(const kdn_gpu_kv* kv) { return kv ? kv->done_event : nullptr; }

KDN_API int kdn_gpu_unregister(kdn_client* client, kdn_gpu_kv* kv) {
  if (!client || !kv) return KDN_ERR_INVALID_ARGUMENT;
  std::unique_ptr<kdn_gpu_kv> owned(kv);
  int status = KDN_OK;
  // A connection kdnd closed (or replaced after a restart) has no registration left to close.
  if (client->c && !client->c->broken() && kv->owner == client->c.get()) {
    status = guarded([&]() -> int {
      Client& c = client_of(client);
      Request r;
      r.sqe.opcode = uint8_t(Opcode::kGpuUnregister);
      kdn::ipc::GpuUnregisterOp::put({kv->ref}, r.sqe);
      auto cqe = c.call(r);
      if (!cqe.ok()) return rc(cqe.status());
      return int(cqe->status);
    });
  }
  let_go(client, kv->owner);
  return status;
}

KDN_API int kdn_gpu_retrieve(kdn_client* client, const kdn_model* model, const int32_t* tokens, size_t n_tokens,
                             uint32_t max_chunks, kdn_gpu_kv* kv, const kdn_engine_layout* dst,
                             uint32_t* loaded_chunks) {
  if (loaded_chunks) *loaded_chunks = 0;
  if (!loaded_chunks) return KDN_ERR_INVALID_ARGUMENT;
  if (int e = check_gpu_call(client, model, tokens, n_tokens, kv, dst)) return e;
  return guarded([&]() -> int {
    Client& c = client_of(client);
    if (c.welcome().proto_minor < kGpuMinor) return int(KDN_ERR_UNSUPPORTED);
    uint64_t whole = n_tokens / model->info.chunk_tokens;
    if (max_chunks && max_chunks < whole) whole = max_chunks;
    if (whole == 0) return int(KDN_OK);
    std::vector<kdn_key> keys(whole);
    kdn::prefix_keys(model->info, {tokens, size_t(whole) * model->info.chunk_tokens}, keys);
    const uint32_t round = chunks_per_request(c, *model, dst->v_layer_base != nullptr);
    if (round == 0) return int(KDN_ERR_LIMIT);
    uint32_t loaded = 0;
    for (uint32_t first = 0; first < whole;) {
      const uint32_t n = uint32_t(std::min<uint64_t>(round, whole - first));
      auto layout = layout_for(*model, *dst, first, n, 0);
      if (!layout.ok()) return rc(layout.status());
      auto cqe = gpu_request(c, Opcode::kGpuRetrieve, *model, *kv, keys, first, n, 0, *layout);
      if (!cqe.ok()) return rc(cqe.status());
      if (cqe->status != KDN_OK) {
        *loaded_chunks = loaded;  // those are queued; the done event follows them
        return int(cqe->status);
      }
      auto res = kdn::ipc::GpuRetrieveOp::result(*cqe, n);
      if (!res.ok()) return rc(res.status());
      note_ticket(*kv, res->ticket);
      loaded += res->loaded;
      if (res->loaded < n) break;  // the prefix ends in this window
      first += n;
    }
    *loaded_chunks = loaded;
    return int(KDN_OK);
  });
}

KDN_API int kdn_gpu_store(kdn_client* client, const kdn_model* model, const int32_t* tokens, size_t n_tokens,
                          uint32_t first_chunk, uint32_t n_chunks, kdn_gpu_kv* kv, const kdn_engine_layout* src,
                          uint32_t* stored) {
  if (stored) *stored = 0;
  if (int e = check_gpu_call(client, model, tokens, n_tokens, kv, src)) return e;
  return guarded([&]() -> int {
    Client& c = client_of(client);
    if (c.welcome().proto_minor < kGpuMinor) return int(KDN_ERR_UNSUPPORTED);
    const uint64_t whole = n_tokens / model->info.chunk_tokens;
    if (first_chunk > whole) return int(KDN_ERR_INVALID_ARGUMENT);
    const uint64_t end = std::min<uint64_t>(whole, uint64_t(first_chunk) + n_chunks);
    if (end <= first_chunk) return int(KDN_OK);
    std::vector<kdn_key> keys(end);
    kdn::prefix_keys(model->info, {tokens, size_t(end) * model->info.chunk_tokens}, keys);
    const uint32_t round = chunks_per_request(c, *model, src->v_layer_base != nullptr);
    if (round == 0) return int(KDN_ERR_LIMIT);
    uint32_t written = 0;
    for (uint32_t first = first_chunk; first < end;) {
      const uint32_t n = uint32_t(std::min<uint64_t>(round, end - first));
      auto layout = layout_for(*model, *src, first, n, first_chunk);
      if (!layout.ok()) return rc(layout.status());
      auto cqe = gpu_request(c, Opcode::kGpuStore, *model, *kv, keys, first, n, 0, *layout);
      if (!cqe.ok()) return rc(cqe.status());
      if (cqe->status != KDN_OK) {
        if (stored) *stored = written;
        return int(cqe->status);
      }
      auto res = kdn::ipc::GpuStoreOp::result(*cqe, n);
      if (!res.ok()) return rc(res.status());
      written += res->stored;
      first += n;
    }
    if (stored) *stored = written;
    return int(KDN_OK);
  });
}

KDN_API int kdn_gpu_segment_retrieve(kdn_client* client, const kdn_model* model, const kdn_segment* segs, size_t n_segs,
                                     const int64_t* target_pos, kdn_gpu_kv* kv, const kdn_engine_layout* dst,
                                     uint32_t* loaded_chunks) {
  if (loaded_chunks && segs) std::fill(loaded_chunks, loaded_chunks + n_segs, 0);
  if (!target_pos) return KDN_ERR_INVALID_ARGUMENT;
  if (int e = check_gpu_call(client, model, nullptr, 0, kv, dst)) return e;
  return guarded([&]() -> int {
    std::vector<SegmentPlan> plans;
    std::vector<kdn_key> keys;
    if (Status st = plan_keys(model->info, segs, n_segs, plans, keys); !st.ok()) return rc(st);
    bool moves = false;
    if (Status st = check_targets(segs, n_segs, target_pos, &moves); !st.ok()) return rc(st);
    if (moves && model->info.desc.rope_style == KDN_ROPE_NONE) return int(KDN_ERR_UNSUPPORTED);  // as on the host
    Client& c = client_of(client);
    if (c.welcome().proto_minor < kGpuMinor) return int(KDN_ERR_UNSUPPORTED);
    const uint32_t round =
        chunks_per_request(c, *model, dst->v_layer_base != nullptr, sizeof(kdn::ipc::GpuSegmentChunkRecord) + 1);
    if (round == 0) return int(KDN_ERR_LIMIT);
    const std::vector<SegmentChunk> all = segment_chunks(*model, plans, target_pos);
    std::vector<uint32_t> loaded(n_segs, 0);
    std::vector<uint8_t> broken(n_segs, 0), copied;
    // In rounds of what the payload area holds; a segment that met a miss sends no more chunks.
    for (size_t next = 0; next < all.size();) {
      std::vector<size_t> win;
      for (; next < all.size() && win.size() < round; ++next)
        if (!broken[all[next].seg]) win.push_back(next);
      if (win.empty()) break;
      auto res = segment_request(c, *model, *kv, *dst, all, keys, win, copied);
      if (!res.ok()) {
        if (loaded_chunks) std::copy(loaded.begin(), loaded.end(), loaded_chunks);  // queued; the done event follows
        return rc(res.status());
      }
      note_ticket(*kv, res->ticket);
      for (size_t j = 0; j < win.size(); ++j) {
        const size_t s = all[win[j]].seg;
        if (copied[j] == kdn::ipc::kGpuSegmentLoaded)
          ++loaded[s];
        else
          broken[s] = 1;
      }
    }
    if (loaded_chunks) std::copy(loaded.begin(), loaded.end(), loaded_chunks);
    for (size_t s = 0; s < n_segs; ++s)
      if (loaded[s] < plans[s].chunks) return int(KDN_ERR_NOT_FOUND);
    return int(KDN_OK);
  });
}

KDN_API int kdn_gpu_blend_select(kdn_client* client, const kdn_model* model, const kdn_segment* segs, size_t n_segs,
                                 const int64_t* target_pos, kdn_gpu_kv* kv, const kdn_engine_layout* dst,
                                 uint32_t check_layer, uint32_t plane, double ratio, int32_t* selected,
                                 uint32_t capacity, uint32_t* n_selected, uint32_t* n_compared) {
  using Op = kdn::ipc::GpuBlendSelectOp;
  if (n_selected) *n_selected = 0;
  if (n_compared) *n_compared = 0;
  if (!target_pos || !n_selected || (!selected && capacity > 0)) return KDN_ERR_INVALID_ARGUMENT;
  if (plane != KDN_BLEND_PLANE_K && plane != KDN_BLEND_PLANE_V) return KDN_ERR_INVALID_ARGUMENT;
  if (!(ratio >= 0.0 && ratio <= 1.0)) return KDN_ERR_INVALID_ARGUMENT;  // NaN too
  if (int e = check_gpu_call(client, model, nullptr, 0, kv, dst)) return e;
  if (check_layer >= model->info.desc.num_layers) return KDN_ERR_INVALID_ARGUMENT;
  return guarded([&]() -> int {
    std::vector<SegmentPlan> plans;
    std::vector<kdn_key> keys;
    if (Status st = plan_keys(model->info, segs, n_segs, plans, keys); !st.ok()) return rc(st);
    bool moves = false;
    if (Status st = check_targets(segs, n_segs, target_pos, &moves); !st.ok()) return rc(st);
    if (moves && model->info.desc.rope_style == KDN_ROPE_NONE) return int(KDN_ERR_UNSUPPORTED);  // as on the host
    Client& c = client_of(client);
    if (c.welcome().proto_minor < kTicketMinor) return int(KDN_ERR_UNSUPPORTED);  // a kdnd from before GPU_BLEND_SELECT
    const std::vector<SegmentChunk> all = segment_chunks(*model, plans, target_pos);
    if (all.empty()) return int(KDN_OK);
    // One request: the selection ranks every compared token at once.
    const uint32_t T = model->info.chunk_tokens;
    const uint32_t round = chunks_per_request(c, *model, dst->v_layer_base != nullptr,
                                              sizeof(kdn::ipc::GpuSegmentChunkRecord) + uint64_t(T) * 4);
    if (all.size() > round) return int(KDN_ERR_LIMIT);
    std::vector<size_t> win(all.size());
    for (size_t j = 0; j < win.size(); ++j) win[j] = j;
    auto w = segment_wire(*model, *dst, all, keys, win);
    if (!w.ok()) return rc(w.status());
    const uint64_t tokens = uint64_t(all.size()) * T;
    const uint32_t room =
        uint32_t(std::max<uint64_t>(1, std::min<uint64_t>({capacity, tokens, kdn::ipc::kMaxKeysPerOp})));
    const uint32_t ppm = uint32_t(std::llround(ratio * kdn::ipc::kGpuBlendRatioOne));
    std::vector<std::byte> out;
    auto cqe = segment_call(c, *w, room * 4, out,
                            [&](kdn::ipc::Sqe& q, kdn::ipc::GpuLayoutRef recs, kdn::ipc::GpuLayoutRef lay) {
                              q.opcode = uint8_t(Op::kOpcode);
                              Op::put({model->id, kv->ref, recs, lay, check_layer, plane, ppm}, q);
                            });
    if (!cqe.ok()) return rc(cqe.status());
    if (cqe->status != KDN_OK) return int(cqe->status);
    const auto* idx = reinterpret_cast<const int32_t*>(out.data());
    auto res = Op::result(*cqe, idx, room, uint32_t(all.size()), tokens);
    if (!res.ok()) return rc(res.status());
    if (res->selected > capacity) return int(KDN_ERR_LIMIT);
    for (uint32_t i = 0; i < res->selected; ++i) {  // layout token -> the engine token it stands for
      const SegmentChunk& ch = all[size_t(idx[i]) / T];
      const uint32_t r = uint32_t(idx[i]) % T;
      if (r >= ch.rows) return int(KDN_ERR_PROTOCOL);  // a row past its segment was never a candidate
      selected[i] = int32_t(ch.engine_token + r);
    }
    *n_selected = res->selected;
    if (n_compared) *n_compared = res->candidates;
    return int(KDN_OK);
  });
}

KDN_API int kdn_gpu_check(kdn_client* client, kdn_gpu_kv* kv) {
  if (!client || !kv) return KDN_ERR_INVALID_ARGUMENT;
  if (!client->c || kv->owner != client->c.get()) return KDN_ERR_UNAVAILABLE;  // registered before kdnd restarted
  return guarded([&]() -> int {
    Client& c = client_of(client);
    if (c.welcome().proto_minor < kTicketMinor) return int(KDN_ERR_UNSUPPORTED);
    if (kv->unchecked_first == 0) return int(KDN_OK);  // nothing retrieved since the last check
    Request r;
    r.sqe.opcode = uint8_t(Opcode::kGpuCheck);
    kdn::ipc::GpuCheckOp::put({kv->ref, kv->unchecked_first, kv->unchecked_last}, r.sqe);
    auto cqe = c.call(r);
    if (!cqe.ok()) return rc(cqe.status());
    kv->unchecked_first = kv->unchecked_last = 0;  // answered: the next check starts after these
    return int(cqe->status);
  });
}

KDN_API int kdn_gpu_prefetch(kdn_client* client, const kdn_model* model, const int32_t* tokens, size_t n_tokens,
                             kdn_gpu_kv* kv, uint32_t* cached_chunks, uint32_t* queued_chunks) {
  if (cached_chunks) *cached_chunks = 0;
  if (queued_chunks) *queued_chunks = 0;
  if (int e = check_model_call(client, model, tokens, n_tokens)) return e;
  if (!kv) return KDN_ERR_INVALID_ARGUMENT;
  if (kv->owner != client->c.get()) return KDN_ERR_UNAVAILABLE;  // registered before kdnd restarted
  return guarded([&]() -> int {
    Client& c = client_of(client);
    if (c.welcome().proto_minor < kTicketMinor) return int(KDN_ERR_UNSUPPORTED);
    const uint64_t whole = n_tokens / model->info.chunk_tokens;
    if (whole == 0) return int(KDN_OK);
    std::vector<kdn_key> keys(whole);
    kdn::prefix_keys(model->info, {tokens, size_t(whole) * model->info.chunk_tokens}, keys);
    const uint32_t round =
        uint32_t(std::min<uint64_t>(kdn::ipc::kMaxKeysPerOp, c.welcome().payload_bytes / 2 / sizeof(kdn_key)));
    if (round == 0) return int(KDN_ERR_LIMIT);
    uint32_t cached = 0, queued = 0;
    for (uint32_t first = 0; first < whole;) {
      const uint32_t n = uint32_t(std::min<uint64_t>(round, whole - first));
      auto in = c.alloc_payload(n * uint32_t(sizeof(kdn_key)));
      if (!in.ok()) return rc(in.status());
      std::memcpy(c.payload_ptr(*in), keys.data() + first, n * sizeof(kdn_key));
      Request r;
      r.sqe.opcode = uint8_t(Opcode::kGpuPrefetch);
      r.in = *in;
      r.sqe.in_len = n * uint32_t(sizeof(kdn_key));
      kdn::ipc::GpuPrefetchOp::put({model->id, kv->ref, 0}, r.sqe);
      auto cqe = c.call(r);
      c.free_payload(*in);
      if (!cqe.ok()) return rc(cqe.status());
      if (cqe->status != KDN_OK) {  // what earlier rounds queued stands
        if (cached_chunks) *cached_chunks = cached;
        if (queued_chunks) *queued_chunks = queued;
        return int(cqe->status);
      }
      auto res = kdn::ipc::GpuPrefetchOp::result(*cqe, n);
      if (!res.ok()) return rc(res.status());
      cached += res->cached;
      queued += res->queued;
      if (res->cached < n) break;  // the prefix ends in this window
      first += n;
    }
    if (cached_chunks) *cached_chunks = cached;
    if (queued_chunks) *queued_chunks = queued;
    return int(KDN_OK);
  });
}
