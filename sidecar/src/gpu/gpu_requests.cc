// The GPU tier's opcodes (docs/gpu.md): registrations, retrieves into an engine's blocks (a
// prefix, or segment chunks re-positioned), the blend selection, prefetch into T0, stores
// gathered from the engine, and the tickets' check. The leasing ones run the handler's leasing
// loop (request_lease.cc) with kdnd as the holder, then continue here.
#include "request_handler.h"

#include "gpu/gpu_request.h"
#include "gpu/gpu_rope.h"
#include "gpu/gpu_service.h"
#include "request_slices.h"

#include <kdn/ipc/ops.h>

#include <algorithm>
#include <cstring>

namespace kdn::sidecar {

namespace {
constexpr Status kNoGpuTier(Code::kUnsupported, "this kdnd has no GPU tier");
}  // namespace

Step RequestHandler::serve(Op& op, uint64_t, ipc::GpuRegisterOp) {
  if (gpu_ == nullptr) return finish(op, kNoGpuTier);
  ipc::GpuRegisterRecord rec;
  auto in = op.session->shm.payload().copy_in_records(op.sqe, std::span(&rec, 1));
  if (!in.ok()) return finish(op, in.status());
  auto out = gpu_->register_memory(*op.session, rec);
  if (!out.ok()) return finish(op, out.status());
  Status wrote =
      op.session->shm.payload().copy_out_records(op.sqe, std::span<const ipc::GpuRegisteredRecord>(&*out, 1));
  if (!wrote.ok()) {
    (void)gpu_->unregister(*op.session, {out->registration, out->generation});
    return finish(op, wrote);
  }
  ipc::GpuRegisterOp::put({out->registration, out->generation, out->device}, op.cqe);
  return finish(op, OkStatus());
}

Step RequestHandler::serve(Op& op, uint64_t, ipc::GpuUnregisterOp) {
  if (gpu_ == nullptr) return finish(op, kNoGpuTier);
  return finish(op, gpu_->unregister(*op.session, ipc::GpuUnregisterOp::args(op.sqe).reg));
}

Step RequestHandler::serve(Op& op, uint64_t, ipc::GpuInfoOp) {
  ipc::GpuInfoOp::Result r;
  if (gpu_ != nullptr && gpu_->enabled()) {
    const auto stats = gpu_->device_stats();
    std::vector<ipc::GpuDeviceRecord> recs;
    for (size_t i = 0; i < stats.size() && i < op.shape.out_capacity; ++i) {
      const gpu::DeviceStats& d = stats[i];
      ipc::GpuDeviceRecord g{};
      g.ordinal = uint32_t(d.info.ordinal);
      g.sm = uint32_t(d.info.sm_major * 10 + d.info.sm_minor);
      std::memcpy(g.name, d.info.name, std::min(sizeof g.name, sizeof d.info.name));
      g.name[sizeof g.name - 1] = '\0';
      std::memcpy(g.uuid, d.info.uuid, sizeof g.uuid);
      g.memory_bytes = d.info.memory_bytes;
      g.peer_mask = d.peer_mask;
      g.t0_capacity_bytes = d.t0_capacity;
      g.t0_used_bytes = d.t0_used;
      g.t0_chunks = d.t0_chunks;
      g.pci_domain = uint32_t(d.info.pci_domain);
      g.pci_bus = uint32_t(d.info.pci_bus);
      g.pci_device = uint32_t(d.info.pci_device);
      g.flags =
          (d.info.vmm_supported ? ipc::kGpuDeviceVmm : 0) | (d.info.posix_fd_handles ? ipc::kGpuDevicePosixFd : 0);
      recs.push_back(g);
    }
    Status wrote = op.session->shm.payload().copy_out_records(op.sqe, std::span<const ipc::GpuDeviceRecord>(recs));
    if (!wrote.ok()) return finish(op, wrote);
    r.written = uint32_t(recs.size());
    r.devices = uint32_t(stats.size());
    r.enabled = 1;
    r.registrations = uint32_t(gpu_->registrations());
  }
  ipc::GpuInfoOp::put(r, op.cqe);
  return finish(op, OkStatus());
}

// ---- the leasing GPU opcodes --------------------------------------------------------------------

std::optional<Step> RequestHandler::gpu_lease(Op& op, uint64_t deadline_ns, uint32_t wanted) {
  if (!op.gpu) {
    Status prepared = gpu_prepare(op);
    if (!prepared.ok()) return finish(op, prepared);
  }
  return lease_records(op, deadline_ns, wanted);
}

Step RequestHandler::serve(Op& op, uint64_t deadline_ns, ipc::GpuRetrieveOp) {
  const uint32_t wanted = ipc::GpuRetrieveOp::wanted(ipc::GpuRetrieveOp::args(op.sqe), op.shape.in_records);
  if (auto step = gpu_lease(op, deadline_ns, wanted)) return *step;
  note_leases(op, wanted);
  return gpu_queue_retrieve(op);
}

Step RequestHandler::serve(Op& op, uint64_t deadline_ns, ipc::GpuSegmentRetrieveOp) {
  if (auto step = gpu_lease(op, deadline_ns, op.shape.in_records)) return *step;
  note_leases(op, op.shape.in_records);
  return gpu_queue_segment(op);
}

// Not a read: the retrieve that follows counts.
Step RequestHandler::serve(Op& op, uint64_t deadline_ns, ipc::GpuPrefetchOp) {
  const uint32_t wanted = ipc::GpuPrefetchOp::wanted(ipc::GpuPrefetchOp::args(op.sqe), op.shape.in_records);
  if (auto step = gpu_lease(op, deadline_ns, wanted)) return *step;
  return gpu_queue_prefetch(op);
}

// Checks a GPU request's registration and layout before anything is taken.
Status RequestHandler::gpu_prepare(Op& op) {
  if (gpu_ == nullptr) return kNoGpuTier;
  Session& s = *op.session;
  const bool store = op.sqe.opcode == uint8_t(ipc::Opcode::kGpuStore);
  const bool blend = op.sqe.opcode == uint8_t(ipc::Opcode::kGpuBlendSelect);
  const bool segment = op.traits->segment_records;
  if (op.sqe.opcode == uint8_t(ipc::Opcode::kGpuPrefetch)) {  // no layout: nothing reaches the engine
    const ipc::GpuRegistrationRef ref = ipc::GpuPrefetchOp::args(op.sqe).reg;
    KDN_RETURN_IF_ERROR(gpu_->find(s, ref).status());
    auto req = std::make_shared<gpu::GpuRequest>();
    req->store = s.ns->store.get();
    req->ref = ref;
    op.gpu = std::move(req);
    return OkStatus();
  }
  // GPU_BLEND_SELECT's registration, records and layout travel as GPU_SEGMENT_RETRIEVE's do.
  const ipc::GpuRegistrationRef ref = store     ? ipc::GpuStoreOp::args(op.sqe).reg
                                      : segment ? ipc::GpuSegmentRetrieveOp::args(op.sqe).reg
                                                : ipc::GpuRetrieveOp::args(op.sqe).reg;
  const ipc::GpuLayoutRef lay = store     ? ipc::GpuStoreOp::args(op.sqe).layout
                                : segment ? ipc::GpuSegmentRetrieveOp::args(op.sqe).layout
                                          : ipc::GpuRetrieveOp::args(op.sqe).layout;
  if (blend) KDN_RETURN_IF_ERROR(ipc::GpuBlendSelectOp::check_args(op.sqe, op.model->desc.num_layers));
  auto reg = gpu_->find(s, ref);
  if (!reg.ok()) return reg.status();
  if (lay.len > ipc::kGpuMaxLayoutBytes) return Status(Code::kInvalidArgument, "GPU layout larger than 16 MiB");
  std::vector<std::byte> bytes(lay.len);
  KDN_RETURN_IF_ERROR(s.shm.payload().copy_in(lay.off, std::span(bytes)));  // the one read of it
  auto layout = ipc::decode_gpu_layout(bytes);
  if (!layout.ok()) return layout.status();
  auto checked = gpu::check_and_translate(*layout, kernels::chunk_geometry_of(*op.model), op.shape.in_records,
                                          gpu::GpuService::range_of(**reg));
  if (!checked.ok()) {
    ++gpu_->counters().bounds_refused;
    return checked.status();
  }
  auto req = std::make_shared<gpu::GpuRequest>();
  req->store = s.ns->store.get();
  req->ref = ref;
  req->layout = std::move(*checked);
  if (segment) KDN_RETURN_IF_ERROR(gpu_read_segment_chunks(op, *req));
  op.gpu = std::move(req);
  return OkStatus();
}

// GPU_SEGMENT_RETRIEVE: kdnd's one copy of the chunk records, checked against the keys and the
// layout before anything is leased.
Status RequestHandler::gpu_read_segment_chunks(Op& op, gpu::GpuRequest& req) {
  const ipc::GpuLayoutRef where = ipc::GpuSegmentRetrieveOp::args(op.sqe).chunks;
  const uint32_t keys = op.shape.in_records;
  if (where.len != uint64_t(keys) * sizeof(ipc::GpuSegmentChunkRecord))
    return Status(Code::kInvalidArgument, "GPU_SEGMENT_RETRIEVE: one chunk record per key");
  req.segment_chunks.resize(keys);
  KDN_RETURN_IF_ERROR(
      op.session->shm.payload().copy_in(where.off, std::as_writable_bytes(std::span(req.segment_chunks))));
  return ipc::GpuSegmentRetrieveOp::check_chunks(req.segment_chunks, keys, op.model->chunk_tokens,
                                                 req.layout.slots.size());
}

// What a segment request works on once leased: per segment the leading cached chunks (the other
// leases are given back at once), their records, the registration (it may have been
// unregistered while promotions ran) and the chunks' placement.
Status RequestHandler::gpu_segment_work(Op& op, gpu::SegmentWork& w) {
  Session& s = *op.session;
  gpu::GpuRequest& g = *op.gpu;
  std::vector<uint8_t> cached(op.shape.in_records, 0);
  for (uint32_t p : g.position) cached[p] = 1;
  w.copied = gpu::leading_chunks(g.segment_chunks, cached);
  w.chunks.reserve(g.leased.size());
  w.recs.reserve(g.leased.size());
  for (size_t j = 0; j < g.leased.size(); ++j) {
    if (!w.copied[g.position[j]]) continue;
    w.chunks.push_back(g.leased[j]);
    w.recs.push_back(g.segment_chunks[g.position[j]]);
  }
  std::vector<Entry*> keep = w.chunks;          // (may throw: nothing given back yet)
  for (size_t j = 0; j < g.leased.size(); ++j)  // past a miss of its segment: not used
    if (!w.copied[g.position[j]]) s.ns->store->unpin(g.leased[j]);
  g.leased.swap(keep);  // what the request still holds until a batch takes it over
  g.position.clear();
  auto reg = gpu_->find(s, g.ref);
  if (!reg.ok()) return reg.status();
  w.reg = *reg;
  auto placement = gpu::place_segment_chunks(op.model->desc, w.recs);
  if (!placement.ok()) return placement.status();
  w.placement = std::move(*placement);
  return OkStatus();
}

// GPU_SEGMENT_RETRIEVE after its leases: the leading cached chunks are queued with their deltas
// (docs/gpu.md).
Step RequestHandler::gpu_queue_segment(Op& op) {
  Session& s = *op.session;
  gpu::SegmentWork w;
  Status st = gpu_segment_work(op, w);
  if (st.ok()) st = s.shm.payload().copy_out_records(op.sqe, std::span<const uint8_t>(w.copied));
  if (!st.ok()) {
    rollback(op);
    return finish(op, st);
  }
  op.gpu->leased.clear();
  const uint32_t n = uint32_t(w.chunks.size());
  if (n == 0) {
    ipc::GpuSegmentRetrieveOp::put({0, 0}, op.cqe);
    return finish(op, OkStatus());
  }
  // The batch takes the leases over, whatever comes of it.
  auto from_t0 =
      gpu_->retrieve(*s.ns, *w.reg, op.gpu->layout, kernels::chunk_geometry_of(*op.model), w.chunks, &w.placement);
  if (!from_t0.ok()) return finish(op, from_t0.status());
  ipc::GpuSegmentRetrieveOp::put({n, *from_t0, gpu_->last_ticket()}, op.cqe);
  return finish(op, OkStatus());
}

Step RequestHandler::serve(Op& op, uint64_t deadline_ns, ipc::GpuBlendSelectOp) {
  if (!op.gpu || op.gpu->phase != gpu::GpuRequest::Phase::kCopying) {
    if (auto step = gpu_lease(op, deadline_ns, op.shape.in_records)) return *step;
    note_leases(op, op.shape.in_records);
    return gpu_queue_blend(op);
  }
  if (op.waiting > 0) return Step::kWait;
  gpu::GpuRequest& g = *op.gpu;
  auto picked = gpu_->take_blend(op.token);
  if (g.gpu_failed && picked.ok()) picked = Status(Code::kIo, "the GPU work of this blend selection failed");
  if (!picked.ok()) return finish(op, picked.status());
  Status wrote = op.session->shm.payload().copy_out_records(op.sqe, std::span<const int32_t>(*picked));
  if (!wrote.ok()) return finish(op, wrote);
  g.blend.selected = uint32_t(picked->size());
  ipc::GpuBlendSelectOp::put(g.blend, op.cqe);
  return finish(op, OkStatus());
}

// GPU_BLEND_SELECT after its leases: the chunks a segment retrieve would copy are compared on the
// device; the request waits for the answer.
Step RequestHandler::gpu_queue_blend(Op& op) {
  Session& s = *op.session;
  gpu::GpuRequest& g = *op.gpu;
  gpu::SegmentWork w;
  Status st = gpu_segment_work(op, w);
  const ipc::GpuBlendSelectOp::Args a = ipc::GpuBlendSelectOp::args(op.sqe);
  const kernels::ChunkGeometry geo = kernels::chunk_geometry_of(*op.model);
  auto plan = st.ok() ? gpu::plan_blend(geo, g.layout.slots, w.recs, {a.check_layer, a.plane, a.ratio_ppm},
                                        op.shape.out_capacity)
                      : Result<gpu::BlendPlan>(st);
  if (!plan.ok()) {
    rollback(op);
    return finish(op, plan.status());
  }
  g.leased.clear();
  g.blend = {0, plan->n_candidates, uint32_t(w.chunks.size()), 0};
  if (w.chunks.empty()) {
    ipc::GpuBlendSelectOp::put(g.blend, op.cqe);
    return finish(op, OkStatus());
  }
  // The batch takes the leases over, whatever comes of it.
  auto from_t0 = gpu_->blend_select(*s.ns, *w.reg, g.layout, geo, w.chunks, w.placement, std::move(*plan), op.token);
  if (!from_t0.ok()) return finish(op, from_t0.status());
  g.blend.from_t0 = *from_t0;
  g.phase = gpu::GpuRequest::Phase::kCopying;
  ++op.waiting;  // the batch's token (on_gpu_done)
  return Step::kWait;
}

// The prefix a GPU_RETRIEVE or GPU_PREFETCH leased moves to `chunks` (the batch takes the leases
// over, whatever comes of it) once its registration is found again: it may have been unregistered
// while promotions ran, and then the leases are given back.
Result<gpu::Registration*> RequestHandler::gpu_take_prefix(Op& op, std::vector<Entry*>& chunks) {
  auto reg = gpu_->find(*op.session, op.gpu->ref);
  if (!reg.ok()) {
    rollback(op);
    return reg.status();
  }
  chunks.swap(op.gpu->leased);
  return reg;
}

Step RequestHandler::gpu_queue_retrieve(Op& op) {
  const uint32_t n = uint32_t(op.gpu->leased.size());
  if (n == 0) {
    ipc::GpuRetrieveOp::put({0, 0}, op.cqe);
    return finish(op, OkStatus());
  }
  std::vector<Entry*> chunks;
  auto reg = gpu_take_prefix(op, chunks);
  if (!reg.ok()) return finish(op, reg.status());
  auto from_t0 = gpu_->retrieve(*op.session->ns, **reg, op.gpu->layout, kernels::chunk_geometry_of(*op.model), chunks);
  if (!from_t0.ok()) return finish(op, from_t0.status());
  ipc::GpuRetrieveOp::put({n, *from_t0, gpu_->last_ticket()}, op.cqe);
  return finish(op, OkStatus());
}

// GPU_PREFETCH after its leases: the prefix's chunks are copied into T0 (the leases go with the
// batch, or at once when nothing needed copying).
Step RequestHandler::gpu_queue_prefetch(Op& op) {
  const uint32_t n = uint32_t(op.gpu->leased.size());
  if (n == 0) {
    ipc::GpuPrefetchOp::put({0, 0, 0}, op.cqe);
    return finish(op, OkStatus());
  }
  std::vector<Entry*> chunks;
  auto reg = gpu_take_prefix(op, chunks);
  if (!reg.ok()) return finish(op, reg.status());
  auto done = gpu_->prefetch(*op.session->ns, **reg, kernels::chunk_geometry_of(*op.model), chunks);
  if (!done.ok()) return finish(op, done.status());
  ipc::GpuPrefetchOp::put({n, done->queued, done->resident}, op.cqe);
  return finish(op, OkStatus());
}

Step RequestHandler::serve(Op& op, uint64_t deadline_ns, ipc::GpuStoreOp) {
  if (!op.gpu) {
    Status prepared = gpu_prepare(op);
    if (!prepared.ok()) return finish(op, prepared);
  }
  switch (op.gpu->phase) {
    case gpu::GpuRequest::Phase::kCollect:
      return gpu_collect(op, deadline_ns);
    case gpu::GpuRequest::Phase::kCopying:
      if (op.waiting > 0) return Step::kWait;
      op.gpu->phase = gpu::GpuRequest::Phase::kCommitting;
      [[fallthrough]];
    case gpu::GpuRequest::Phase::kCommitting:
    case gpu::GpuRequest::Phase::kSettling:
      return gpu_commit(op, deadline_ns);
  }
  return finish(op, Status(Code::kInternal, "GPU_STORE in an unknown phase"));
}

// Reserves a host slot for every key not cached yet, then queues the GPU's gathers into them.
Step RequestHandler::gpu_collect(Op& op, uint64_t deadline_ns) {
  Session& s = *op.session;
  TieredStore& store = *s.ns->store;
  gpu::GpuRequest& g = *op.gpu;
  const uint32_t n = op.shape.in_records;
  const uint64_t bytes = op.model->chunk_bytes;
  if (s.closed) {  // the client is gone: store nothing more
    rollback(op);
    return finish(op, Status(Code::kUnavailable, "session closed"));
  }
  op.wants_room = false;
  kdn_key keys[kBatch];
  bool full = false;
  while (op.cursor < n && !full) {
    const uint32_t first = op.cursor, m = std::min(kBatch, n - first);
    Status in = s.shm.payload().copy_in_slice(op.sqe, first, std::span(keys, m));
    if (!in.ok()) {
      rollback(op);
      return finish(op, in);
    }
    make_room(g.reserved, m);  // so a reservation made is always one that can be rolled back
    make_room(g.position, m);
    const uint64_t now = now_ns();
    uint32_t i = 0;
    for (; i < m; ++i) {
      auto r = store.reserve(keys[i], op.model->fingerprint, bytes, s.id, now);
      if (!r.ok()) {
        if (r.status().code() == Code::kInProgress) {  // room comes when demotions land: wait, as RESERVE does
          if (!room_wait_over(op, now, config_.room_wait_ms)) {
            op.cursor = first + i;
            op.wants_room = true;
            return Step::kWait;
          }
        } else if (r.status().code() != Code::kNoSpace) {
          rollback(op);
          return finish(op, r.status());
        }
        full = true;  // the host tier has no room: the rest is not stored (the count says so)
        break;
      }
      if (r->outcome != TieredStore::ReserveOutcome::kReserved) {
        ++g.cached;
        continue;
      }
      g.reserved.push_back(r->entry);
      g.position.push_back(first + i);
    }
    op.cursor = first + i;
    if (!full && op.cursor < n && past(deadline_ns)) return Step::kMore;
  }
  if (g.reserved.empty()) {
    ipc::GpuStoreOp::put({0, g.cached}, op.cqe);
    return finish(op, OkStatus());
  }
  auto reg = gpu_->find(s, g.ref);
  if (!reg.ok()) {
    rollback(op);
    return finish(op, reg.status());
  }
  Status queued =
      gpu_->store(*s.ns, **reg, g.layout, kernels::chunk_geometry_of(*op.model), g.reserved, g.position, op.token);
  if (!queued.ok()) {
    rollback(op);
    return finish(op, queued);
  }
  g.phase = gpu::GpuRequest::Phase::kCopying;
  ++op.waiting;  // the batch's token (on_gpu_done)
  return Step::kWait;
}

// The gathers landed in the host slots: publish them, as COMMIT does, and settle tail first.
Step RequestHandler::gpu_commit(Op& op, uint64_t deadline_ns) {
  Session& s = *op.session;
  TieredStore& store = *s.ns->store;
  gpu::GpuRequest& g = *op.gpu;
  if (g.phase == gpu::GpuRequest::Phase::kCommitting) {
    if (g.gpu_failed) {
      rollback(op);
      return finish(op, Status(Code::kIo, "the GPU copies of this store failed"));
    }
    make_room(g.committed, g.reserved.size());
    std::vector<Entry*> reserved;
    reserved.swap(g.reserved);
    g.position.clear();
    for (Entry* e : reserved) {
      // kdnd itself wrote the bytes into the reservation's own slot: the commit publishes them
      // (and writes them through to lower tiers as configured) without another copy.
      const std::byte* slot = s.ns->host->address(e->placement[tier_index(TierId::kHost)]);
      const kdn_key key = e->key;
      Status st = store.commit(e, slot, op.token, 0);
      if (!st.ok()) {
        if (op.first_error.ok()) op.first_error = st;
        continue;
      }
      ++op.waiting;
      g.committed.push_back(key);
    }
    g.phase = gpu::GpuRequest::Phase::kSettling;
  }
  if (op.waiting > 0) return Step::kWait;
  if (!settle_backwards(op, g.committed, deadline_ns, [&](const kdn_key& k) { store.settle(k); })) return Step::kMore;
  gpu_->encode_stored(s, g.ref, *s.ns, kernels::chunk_geometry_of(*op.model), g.committed,
                      op.token);  // T0 with a codec
  ipc::GpuStoreOp::put({uint32_t(op.done), g.cached}, op.cqe);
  return finish(op, op.first_error);
}

// GPU_CHECK: answers once the registration's batches behind the tickets have landed.
Step RequestHandler::serve(Op& op, uint64_t, ipc::GpuCheckOp) {
  if (op.waiting > 0) return Step::kWait;
  if (gpu_ == nullptr) return finish(op, kNoGpuTier);
  const ipc::GpuCheckOp::Args a = ipc::GpuCheckOp::args(op.sqe);
  auto reg = gpu_->find(*op.session, a.reg);
  if (!reg.ok()) return finish(op, reg.status());
  uint64_t wait_on = 0;
  switch (gpu_->check_tickets(**reg, a.first, a.last, &wait_on)) {
    case gpu::GpuService::Tickets::kOk:
      return finish(op, OkStatus());
    case gpu::GpuService::Tickets::kFailed:
      return finish(
          op, Status(Code::kIo, "a GPU copy behind these tickets failed: the blocks hold bytes kdnd did not write"));
    case gpu::GpuService::Tickets::kTooOld:
      return finish(op, Status(Code::kNotFound, "tickets older than the GPU failures kdnd remembers"));
    case gpu::GpuService::Tickets::kInvalid:
      return finish(op, Status(Code::kInvalidArgument, "GPU_CHECK: an empty ticket range or a ticket not issued yet"));
    case gpu::GpuService::Tickets::kWait:
      if (!gpu_->wait_batch(wait_on, op.token)) return finish(op, Status(Code::kInternal, "GPU_CHECK lost its batch"));
      ++op.waiting;  // the batch's landing (on_gpu_done), then the tickets are checked again
      return Step::kWait;
  }
  return finish(op, Status(Code::kInternal, "GPU_CHECK: an unknown ticket state"));
}

void RequestHandler::on_gpu_done(Op& op, bool failed) noexcept {
  if (op.waiting > 0) --op.waiting;
  if (op.gpu) op.gpu->gpu_failed |= failed;
}

}  // namespace kdn::sidecar
