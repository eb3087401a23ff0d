// The admin and introspection opcodes: STATS, LIST, EVICT, TIER_STATS, METRICS.
#include "request_handler.h"

#include "gpu/gpu_service.h"
#include "request_slices.h"

#include <kdn/ipc/ops.h>

#include <algorithm>

namespace kdn::sidecar {

// ---- STATS, LIST, EVICT ----------------------------------------------------------------------

ipc::StatsRecord RequestHandler::stats(const Namespace& ns, bool node_admin) const noexcept {
  const TieredStore& store = *ns.store;
  const StoreCounters& k = store.counters();
  ipc::StatsRecord r{};
  r.lookups = k.lookups;
  r.lookup_hit_chunks = k.lookup_hit_chunks;
  r.lookup_miss_chunks = k.lookup_miss_chunks;
  r.leases = k.leases;
  r.lease_hit_chunks = k.lease_hit_chunks;
  r.lease_miss_chunks = k.lease_miss_chunks;
  r.stored_chunks = k.stored_chunks;
  r.stored_bytes = k.stored_bytes;
  r.retrieved_chunks = k.retrieved_chunks;
  r.retrieved_bytes = k.retrieved_bytes;
  r.evicted_chunks = k.evicted_chunks;
  r.dropped_chunks = k.dropped_chunks;
  r.demoted_chunks = k.demoted_chunks;
  r.promoted_chunks = k.promoted_chunks;
  for (uint32_t t = 0; t < kTierCount; ++t) {
    r.resident_chunks[t] = k.resident_chunks[t];
    r.resident_bytes[t] = k.resident_bytes[t];
    const Tier* tier = store.policy().tier(TierId(t));
    r.capacity_bytes[t] = tier ? tier->capacity_bytes() : 0;
  }
  r.active_leases = store.active_leases();
  r.open_reservations = store.open_reservations();
  r.in_flight_ops = store.transfers_in_flight();
  r.sessions = ns.sessions;
  r.protocol_errors = ns.counters.protocol_errors;
  r.limit_errors = ns.counters.limit_errors;
  r.corrupt_chunks = k.corrupt_chunks;
  r.expired_reservations = ns.counters.expired_reservations;
  r.staging_bytes = ns.staging_bytes;
  r.host_prefault_left_bytes = ns.prefault_left.load(std::memory_order_relaxed);
  if (node_admin) {
    r.daemon_sessions = counters_.sessions_active;
    r.daemon_requests = counters_.requests;
    r.daemon_handshakes_refused = counters_.handshakes_refused;
    r.daemon_namespaces = counters_.namespaces;
  }
  return r;
}

Step RequestHandler::serve(Op& op, uint64_t, ipc::StatsOp) {
  Session& s = *op.session;
  const ipc::StatsRecord r = stats(*s.ns, s.node_admin);  // a namespace's admin: no daemon-wide words
  const uint32_t words = std::min<uint32_t>(op.shape.out_capacity, sizeof r / sizeof(uint64_t));
  Status out =
      s.shm.payload().copy_out(op.sqe.out_off, std::as_bytes(std::span(&r, 1)).first(words * sizeof(uint64_t)));
  if (!out.ok()) return finish(op, out);
  ipc::StatsOp::put({words}, op.cqe);
  return finish(op, OkStatus());
}

Step RequestHandler::serve(Op& op, uint64_t, ipc::ListOp) {
  Session& s = *op.session;
  const ipc::ListOp::Args args = ipc::ListOp::args(op.sqe);
  const uint64_t cursor = args.cursor, now = now_ns();
  const uint32_t cap = std::min<uint32_t>(op.shape.out_capacity / (args.extended ? 2 : 1), 4096);
  if (cap == 0) return finish(op, Status(Code::kInvalidArgument, "LIST extended needs room for two records"));
  std::vector<ipc::ListRecordExt> page;
  page.reserve(cap);
  uint64_t index = 0;
  bool more = false;
  s.ns->store->index().for_each([&](Entry& e) {
    if (index++ < cursor) return true;
    if (page.size() == cap) {
      more = true;
      return false;
    }
    ipc::ListRecordExt x{};
    x.created = e.created_ns;
    x.chain_head = e.chain_head;
    x.chain_pos = e.chain_pos;
    x.now = now;
    ipc::ListRecord& o = x.base;
    o.key = e.key;
    o.fingerprint = e.fingerprint;
    o.model_id = models_.id_of(e.fingerprint);
    const uint32_t fastest = e.fastest_tier();
    o.tier = uint8_t(fastest < kTierCount ? fastest : tier_index(TierId::kHost));
    o.state = uint8_t(e.state == EntryState::kReserved  ? ipc::ChunkState::kReserved
                      : e.state == EntryState::kWriting ? ipc::ChunkState::kWriting
                      : e.moving != 0                   ? ipc::ChunkState::kMoving
                                                        : ipc::ChunkState::kCommitted);
    o.tier_mask = e.resident;
    o.leases = e.leases;
    o.bytes = e.bytes;
    o.last_access = e.last_access_ns;
    page.push_back(x);
    return true;
  });
  Status out;
  if (args.extended) {
    out = s.shm.payload().copy_out_records(op.sqe, std::span<const ipc::ListRecordExt>(page));
  } else {
    std::vector<ipc::ListRecord> base(page.size());
    for (size_t i = 0; i < page.size(); ++i) base[i] = page[i].base;
    out = s.shm.payload().copy_out_records(op.sqe, std::span<const ipc::ListRecord>(base));
  }
  if (!out.ok()) return finish(op, out);
  const uint32_t written = uint32_t(page.size()) * (args.extended ? 2 : 1);
  ipc::ListOp::put({written, more ? cursor + page.size() : 0}, op.cqe);
  return finish(op, OkStatus());
}

Step RequestHandler::serve(Op& op, uint64_t deadline_ns, ipc::EvictOp) {
  Session& s = *op.session;
  TieredStore& store = *s.ns->store;
  if (ipc::EvictOp::args(op.sqe).mode == ipc::EvictMode::kAll) {
    const uint64_t evicted = store.evict_all();
    ipc::EvictOp::put({evicted, store.index().size()}, op.cqe);
    return finish(op, OkStatus());
  }
  if (ipc::EvictOp::args(op.sqe).mode == ipc::EvictMode::kHost) {
    if (!op.finishing) {
      op.finishing = true;
      const auto [dropped, demoting] = store.demote_all(op.token);
      op.done = dropped;
      op.waiting = uint32_t(demoting);  // an event per demotion as it lands
      if (op.waiting > 0) return Step::kWait;
    }
    ipc::EvictOp::put({op.done, store.counters().resident_chunks[tier_index(TierId::kHost)]}, op.cqe);
    return finish(op, OkStatus());
  }
  const uint32_t n = op.shape.in_records;
  kdn_key keys[kBatch];
  while (op.cursor < n) {
    const uint32_t m = std::min(kBatch, n - op.cursor);
    Status in = s.shm.payload().copy_in_slice(op.sqe, op.cursor, std::span(keys, m));
    if (!in.ok()) return finish(op, in);
    for (uint32_t i = 0; i < m; ++i) {
      if (store.index().find(keys[i]) == nullptr) continue;
      if (store.evict(keys[i]))
        ++op.done;
      else
        ++op.skipped;
    }
    op.cursor += m;
    if (op.cursor < n && past(deadline_ns)) return Step::kMore;
  }
  ipc::EvictOp::put({op.done, op.skipped}, op.cqe);
  return finish(op, OkStatus());
}

// ---- TIER_STATS, METRICS --------------------------------------------------------------------------

std::array<ipc::TierStatsRecord, kTierCount> RequestHandler::tier_stats(const Namespace& ns) const noexcept {
  std::array<ipc::TierStatsRecord, kTierCount> out{};
  const TieredStore& store = *ns.store;
  const StoreCounters& k = store.counters();
  for (uint32_t t = 0; t < kTierCount; ++t) {
    ipc::TierStatsRecord& r = out[t];
    r.tier = t;
    const Tier* tier = store.policy().tier(TierId(t));
    if (tier == nullptr) continue;
    r.present = 1;
    r.capacity_bytes = tier->capacity_bytes();
    r.used_bytes = tier->used_bytes();
    r.resident_chunks = k.resident_chunks[t];
    r.resident_bytes = k.resident_bytes[t];
    r.lookup_hit_chunks = k.hit_chunks[size_t(ReadOp::kLookup)][t] + k.hit_chunks[size_t(ReadOp::kLookupEach)][t];
    r.lease_hit_chunks = k.hit_chunks[size_t(ReadOp::kLease)][t] + k.hit_chunks[size_t(ReadOp::kLeaseEach)][t];
    r.in_flight = tier->in_flight();
  }
  if (gpu_ != nullptr && gpu_->enabled()) {  // T0 is the devices', shared by every namespace
    ipc::TierStatsRecord& r = out[0];
    r.present = 1;
    for (const gpu::DeviceStats& d : gpu_->device_stats()) {
      r.capacity_bytes += d.t0_capacity;
      r.used_bytes += d.t0_used;
      r.resident_chunks += d.t0_chunks;
      r.resident_bytes += d.t0_bytes;
      r.lease_hit_chunks += d.t0.hits;
      r.promoted_chunks += d.t0.promoted;
      r.promoted_bytes += d.t0.promoted_bytes;
    }
    r.in_flight = gpu_->busy() ? 1 : 0;
    gpu_->t0_codec_stats(&r);
  }
  // What the store counts of the tiers below the host, then what each tier counts itself.
  if (ns.tier(TierId::kDisk) != nullptr) {
    ipc::TierStatsRecord& r = out[kDisk];
    r.promoted_chunks = k.promoted_from_chunks[kDisk];
    r.promoted_bytes = k.promoted_from_bytes[kDisk];
    r.demoted_chunks = k.demoted_chunks;
    r.demoted_bytes = k.demoted_bytes;
    r.written_through_chunks = k.written_through_chunks;
    r.recovered_chunks = k.recovered_chunks;
  }
  if (ns.tier(TierId::kRemote) != nullptr) {
    ipc::TierStatsRecord& r = out[kRemote];
    r.promoted_chunks = k.promoted_from_chunks[kRemote];
    r.promoted_bytes = k.promoted_from_bytes[kRemote];
    r.written_through_chunks = k.uploaded_chunks;  // uploads, at commit or as chunks leave memory
    r.recovered_chunks = k.remote_found_chunks;    // found by lookups on local misses
  }
  ns.for_each_lower([&](const Tier& t) { t.describe_stats(out[tier_index(t.id())]); });
  return out;
}

Step RequestHandler::serve(Op& op, uint64_t, ipc::MetricsOp) {
  Session& s = *op.session;
  if (!render_metrics_) return finish(op, Status(Code::kUnsupported, "this kdnd renders no metrics page"));
  const std::string page = render_metrics_(s);  // bad_alloc ends this request alone (step catches it)
  ipc::MetricsOp::Result r;
  r.needed = page.size();
  if (page.size() > op.shape.out_capacity) {
    ipc::MetricsOp::put(r, op.cqe);
    return finish(op, Status(Code::kNoSpace, "the metrics page is larger than the output area"));
  }
  Status out = s.shm.payload().copy_out(op.sqe.out_off, std::as_bytes(std::span(page.data(), page.size())));
  if (!out.ok()) return finish(op, out);
  r.written = uint32_t(page.size());
  ipc::MetricsOp::put(r, op.cqe);
  return finish(op, OkStatus());
}

Step RequestHandler::serve(Op& op, uint64_t, ipc::TierStatsOp) {
  Session& s = *op.session;
  const auto records = tier_stats(*s.ns);
  const uint32_t n = std::min<uint32_t>(op.shape.out_capacity, kTierCount);
  Status out = s.shm.payload().copy_out_records(op.sqe, std::span<const ipc::TierStatsRecord>(records.data(), n));
  if (!out.ok()) return finish(op, out);
  ipc::TierStatsOp::put({n}, op.cqe);
  return finish(op, OkStatus());
}

}  // namespace kdn::sidecar
