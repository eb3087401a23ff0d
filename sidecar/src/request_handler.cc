#include "request_handler.h"

#include "gpu/gpu_request.h"
#include "gpu/gpu_rope.h"
#include "gpu/gpu_service.h"

#include <kdn/common/clock.h>
#include <kdn/ipc/ops.h>

#include <algorithm>
#include <cstring>

namespace kdn::sidecar {

using ipc::Opcode;

const char* refusal_name(Refusal r) noexcept {
  switch (r) {
    case Refusal::kUid: return "uid";
    case Refusal::kPending: return "pending";
    case Refusal::kTimeout: return "timeout";
    case Refusal::kHello: return "hello";
    case Refusal::kVersion: return "version";
    case Refusal::kAccess: return "access";
    case Refusal::kLimit: return "limit";
    case Refusal::kResources: return "resources";
    case Refusal::kCount: break;
  }
  return "unknown";
}

namespace {

constexpr uint32_t kBatch = 64;                        // records copied in per step of a loop
constexpr uint64_t kStagingAlign = StagingArea::kAlign;
constexpr uint32_t kDisk = tier_index(TierId::kDisk);
constexpr uint32_t kRemote = tier_index(TierId::kRemote);
// Keys one remote lookup asks about: a 256K-token prompt at 256 tokens a chunk.
constexpr uint32_t kMaxRemoteProbeKeys = 1024;

bool past(uint64_t deadline_ns) { return now_ns() >= deadline_ns; }

uint64_t staging_slot(uint64_t bytes) { return (bytes + kStagingAlign - 1) / kStagingAlign * kStagingAlign; }

// Room for `more` elements, growing geometrically: reserving exactly size + n on every call
// would copy the vector each time (quadratic in a 65,536-record request). Called before a
// change the request must be able to roll back, so a failed allocation changes nothing.
template <class T>
void make_room(std::vector<T>& v, size_t more) {
  if (v.capacity() - v.size() >= more) return;
  v.reserve(std::max(v.size() + more, 2 * v.capacity() + 16));
}

// Visits items from the last to the first, resuming at op.settled, until all are visited
// (true) or the deadline passes (false: step again). A chain's chunks are visited tail first,
// so the head of every prefix ends up the most recently used and eviction shortens documents
// from their ends, leaving usable prefixes.
template <class T, class F>
bool settle_backwards(Op& op, const std::vector<T>& items, uint64_t deadline_ns, F visit) {
  while (op.settled < items.size()) {
    visit(items[items.size() - 1 - op.settled]);
    if (++op.settled % kBatch == 0 && op.settled < items.size() && past(deadline_ns)) return false;
  }
  return true;
}

bool needs_model(uint8_t opcode) {
  return opcode == uint8_t(Opcode::kLookup) || opcode == uint8_t(Opcode::kReserve) ||
         opcode == uint8_t(Opcode::kLease) || opcode == uint8_t(Opcode::kLookupEach) ||
         opcode == uint8_t(Opcode::kLeaseEach) || opcode == uint8_t(Opcode::kPrefetch) ||
         opcode == uint8_t(Opcode::kGpuRetrieve) || opcode == uint8_t(Opcode::kGpuStore) ||
         opcode == uint8_t(Opcode::kGpuSegmentRetrieve) || opcode == uint8_t(Opcode::kGpuBlendSelect) ||
         opcode == uint8_t(Opcode::kGpuPrefetch);
}

// LEASE serves the longest cached prefix of a chain; LEASE_EACH every key on its own;
// GPU_RETRIEVE and GPU_PREFETCH lease a prefix for kdnd's own copies, GPU_SEGMENT_RETRIEVE and
// GPU_BLEND_SELECT every key on its own.
bool is_lease(uint8_t opcode) {
  return opcode == uint8_t(Opcode::kLease) || opcode == uint8_t(Opcode::kLeaseEach) ||
         opcode == uint8_t(Opcode::kGpuRetrieve) || opcode == uint8_t(Opcode::kGpuSegmentRetrieve) ||
         opcode == uint8_t(Opcode::kGpuBlendSelect) || opcode == uint8_t(Opcode::kGpuPrefetch);
}

// The GPU requests that read segment chunk records (arg1) and lease every key on its own.
bool is_segment(uint8_t opcode) {
  return opcode == uint8_t(Opcode::kGpuSegmentRetrieve) || opcode == uint8_t(Opcode::kGpuBlendSelect);
}

}  // namespace

RequestHandler::RequestHandler(ModelTable& models, DaemonCounters& counters, const Config& config)
    : models_(models), counters_(counters), config_(config) {}

ipc::SessionLimits RequestHandler::limits() const noexcept {
  ipc::SessionLimits l{};
  l.max_leases = config_.max_leases;
  l.max_lease_count = config_.max_lease_count;
  l.max_reservations = config_.max_reservations;
  l.max_in_flight = config_.max_in_flight;
  l.max_models = config_.max_models;
  l.reservation_timeout_ms = config_.reservation_timeout_ms;
  return l;
}

// ---- the frame every request goes through -------------------------------------------------------

Step RequestHandler::step(Op& op, uint64_t deadline_ns) noexcept {
  try {
    if (!op.checked) {
      Status st = check(op);
      if (!st.ok()) return finish(op, st);
      op.checked = true;
    }
    return dispatch(op, deadline_ns);
  } catch (const std::bad_alloc&) {
    op.first_error = Status(Code::kNoMemory, "kdnd ran out of memory serving this request");
  } catch (...) {
    op.first_error = Status(Code::kInternal, "kdnd failed serving this request");
  }
  rollback(op);
  if (op.waiting > 0) return Step::kWait;  // its copies still read staging: finish when they land
  return finish(op, op.first_error);
}

Status RequestHandler::check(Op& op) {
  Session& s = *op.session;
  auto shape = ipc::check_sqe(op.sqe, s.shm.payload().size(), s.admin);
  if (!shape.ok()) return shape.status();
  op.shape = *shape;
  if (!needs_model(op.sqe.opcode)) return OkStatus();
  if (std::find(s.models.begin(), s.models.end(), op.sqe.model_id) == s.models.end())
    return Status(Code::kNotFound, "model_id not registered by this session");
  op.model = models_.get(op.sqe.model_id);
  if (op.model == nullptr) return Status(Code::kInternal, "a session's model is missing from the table");
  return OkStatus();
}

Step RequestHandler::dispatch(Op& op, uint64_t deadline_ns) {
  switch (Opcode(op.sqe.opcode)) {
    case Opcode::kPing: return ping(op);
    case Opcode::kRegisterModel: return register_model(op);
    case Opcode::kLookup: return lookup(op, deadline_ns);
    case Opcode::kReserve: return reserve(op, deadline_ns);
    case Opcode::kCommit: return commit(op, deadline_ns);
    case Opcode::kAbort: return abort(op, deadline_ns);
    case Opcode::kLease: return lease(op, deadline_ns);
    case Opcode::kRelease: return release(op, deadline_ns);
    case Opcode::kStats: return stats(op);
    case Opcode::kList: return list(op);
    case Opcode::kEvict: return evict(op, deadline_ns);
    case Opcode::kPrefetch: return prefetch(op, deadline_ns);
    case Opcode::kTierStats: return tier_stats(op);
    case Opcode::kMetrics: return metrics(op);
    case Opcode::kLookupEach: return lookup_each(op, deadline_ns);
    case Opcode::kLeaseEach: return lease(op, deadline_ns);
    case Opcode::kGpuRegister: return gpu_register(op);
    case Opcode::kGpuUnregister: return gpu_unregister(op);
    case Opcode::kGpuRetrieve: return lease(op, deadline_ns);
    case Opcode::kGpuStore: return gpu_store(op, deadline_ns);
    case Opcode::kGpuInfo: return gpu_info(op);
    case Opcode::kGpuSegmentRetrieve: return lease(op, deadline_ns);
    case Opcode::kGpuBlendSelect: return gpu_blend(op, deadline_ns);
    case Opcode::kGpuCheck: return gpu_check(op);
    case Opcode::kGpuPrefetch: return lease(op, deadline_ns);
  }
  return finish(op, Status(Code::kUnsupported, "unknown opcode"));
}

Step RequestHandler::finish(Op& op, Status status) {
  Session& s = *op.session;
  op.cqe.user_data = op.sqe.user_data;
  op.cqe.status = status.raw();
  if (status.code() == Code::kProtocol) {
    ++s.protocol_errors;
    ++s.ns->counters.protocol_errors;
    ++counters_.protocol_errors;
  } else if (status.code() == Code::kLimit) {
    ++s.ns->counters.limit_errors;
    ++counters_.limit_errors;
  }
  return Step::kDone;
}

void RequestHandler::rollback(Op& op) noexcept {
  Session& s = *op.session;
  if (op.sqe.opcode == uint8_t(Opcode::kReserve)) {
    for (uint64_t id : op.taken) abort_reservation(s, id);
  } else if (is_lease(op.sqe.opcode)) {
    for (uint64_t id : op.taken) release_lease(s, id, 1);
  }
  // A GPU_STORE whose gathers are in flight keeps its slots until its batch lands (its Op
  // lives until then and gives them back).
  if (op.gpu && op.gpu->phase != gpu::GpuRequest::Phase::kCopying) op.gpu->release();
  op.taken.clear();
  op.done = 0;
}

void RequestHandler::on_event(Op& op, const StoreEvent& ev) noexcept {
  if (op.waiting > 0) --op.waiting;
  if (ev.probe) return;  // what the shared tier held is in the index now: the request goes on
  Session& s = *op.session;
  if (op.sqe.opcode == uint8_t(Opcode::kCommit)) {
    s.staging.free(ev.cookie);  // the copy has read the slot: it is the session's again
    if (ev.status.ok()) ++op.done;
    else if (op.first_error.ok()) op.first_error = Status(Code::kIo, "copying a chunk into the arena failed");
  } else if (is_lease(op.sqe.opcode) && !ev.status.ok()) {
    op.stop_at = op.cursor;  // the promotion of the chunk at the cursor failed: a miss there
  } else if (op.sqe.opcode == uint8_t(Opcode::kGpuStore)) {
    if (ev.status.ok()) ++op.done;
    else if (op.first_error.ok()) op.first_error = Status(Code::kIo, "publishing a chunk stored from the GPU failed");
  } else if (op.sqe.opcode == uint8_t(Opcode::kEvict) && ev.status.ok()) {
    ++op.done;  // EVICT kHost: a demotion landed
  }
}

bool RequestHandler::ask_remote(Op& op, uint32_t at, uint32_t end) {
  TieredStore& store = *op.session->ns->store;
  if (op.remote_asked || store.remote() == nullptr || at >= end) return false;
  op.remote_asked = true;
  std::vector<kdn_key> keys(std::min(end - at, kMaxRemoteProbeKeys));
  if (!op.session->shm.payload().copy_in_slice(op.sqe, at, std::span(keys)).ok()) return false;
  if (!store.probe_remote(keys, op.model->fingerprint, op.model->chunk_bytes, op.token).ok()) return false;
  ++op.waiting;
  return true;
}

uint32_t RequestHandler::read_ahead_limit(const TieredStore& store) const noexcept {
  return store.remote() ? std::max(config_.disk.read_ahead, config_.remote.read_ahead) : config_.disk.read_ahead;
}

// ---- holdings ---------------------------------------------------------------------------------

void RequestHandler::abort_reservation(Session& s, uint64_t id) noexcept {
  auto it = s.reservations.find(id);
  if (it == s.reservations.end()) return;
  s.ns->store->abort(it->second.entry);
  s.staging.free(it->second.staging_offset);
  s.reservations.erase(it);
}

void RequestHandler::release_lease(Session& s, uint64_t id, uint32_t count) noexcept {
  auto it = s.leases.find(id);
  if (it == s.leases.end()) return;
  LeaseHold& h = it->second;
  h.count = count < h.count ? h.count - count : 0;
  if (h.count > 0) return;
  s.ns->store->unpin(h.entry);
  s.lease_ids.erase(h.entry);
  s.leases.erase(it);
}

void RequestHandler::drop_holdings(Session& s) noexcept {
  for (auto& [id, h] : s.leases) s.ns->store->unpin(h.entry);
  s.leases.clear();
  s.lease_ids.clear();
  for (auto& [id, r] : s.reservations) s.ns->store->abort(r.entry);
  s.reservations.clear();
  s.reservation_order.clear();
  for (uint32_t m : s.models) models_.release(m, s.uid);
  s.models.clear();
  if (gpu_) gpu_->drop_session(s.id);  // closed once their copies land
}

uint64_t RequestHandler::expire_reservations(Session& s, uint64_t now_ns) noexcept {
  uint64_t expired = 0;
  while (!s.reservation_order.empty()) {
    const uint64_t id = s.reservation_order.front();
    auto it = s.reservations.find(id);
    if (it != s.reservations.end()) {
      if (it->second.deadline_ns > now_ns) break;
      abort_reservation(s, id);
      ++expired;
    }
    s.reservation_order.pop_front();
  }
  s.ns->counters.expired_reservations += expired;
  return expired;
}

ipc::SlotRef RequestHandler::arena_ref(const Session& s, const Entry* e) const noexcept {
  return ipc::SlotRef{s.ns->region_id, s.ns->region_generation, e->placement[tier_index(TierId::kHost)].offset};
}

// ---- PING, REGISTER_MODEL ---------------------------------------------------------------------

Step RequestHandler::ping(Op& op) {
  ipc::PingOp::put(ipc::PingOp::Result{ipc::PingOp::args(op.sqe).cookie}, op.cqe);
  return finish(op, OkStatus());
}

Step RequestHandler::register_model(Op& op) {
  Session& s = *op.session;
  ipc::ModelRecord rec;
  Status in = s.shm.payload().copy_in(op.sqe.in_off, std::as_writable_bytes(std::span(&rec, 1)));
  if (!in.ok()) return finish(op, in);
  if (rec.reserved != 0) return finish(op, Status(Code::kProtocol, "ModelRecord reserved field is not zero"));
  auto info = ModelInfo::from_desc(ipc::from_wire(rec));
  if (!info.ok()) return finish(op, info.status());
  uint32_t id = models_.id_of(info->fingerprint);
  const bool mine = id != 0 && std::find(s.models.begin(), s.models.end(), id) != s.models.end();
  if (!mine) {
    if (s.models.size() >= config_.max_models)
      return finish(op, Status(Code::kLimit, "this session registered max_models models"));
    s.models.reserve(s.models.size() + 1);  // may throw: before the table takes a reference
    auto got = models_.acquire(*info, s.uid);
    if (!got.ok()) return finish(op, got.status());
    id = *got;
    s.models.push_back(id);
  }
  if (s.ns->disk) s.ns->disk->learn_model(*info);  // its demotions can be encoded now
  if (s.ns->remote) s.ns->remote->learn_model(*info);  // and its uploads (remote_codec)
  ipc::RegisterModelOp::put({id, info->chunk_bytes, info->chunk_tokens, info->fingerprint}, op.cqe);
  return finish(op, OkStatus());
}

// ---- LOOKUP -----------------------------------------------------------------------------------

Step RequestHandler::lookup(Op& op, uint64_t deadline_ns) {
  Session& s = *op.session;
  TieredStore& store = *s.ns->store;
  const uint32_t n = op.shape.in_records;
  kdn_key keys[kBatch];
  bool stopped = false;
  while (op.cursor < n && !stopped) {
    const uint32_t m = std::min(kBatch, n - op.cursor);
    Status in = s.shm.payload().copy_in_slice(op.sqe, op.cursor, std::span(keys, m));
    if (!in.ok()) return finish(op, in);
    uint32_t tiers[kTierCount] = {};
    std::function<bool(const Entry&)> in_gpu;
    if (gpu_ != nullptr && gpu_->holds_any())
      in_gpu = [&](const Entry& e) { return gpu_->holds(s.ns->region_id, e); };
    const uint32_t hits = store.lookup(std::span(keys, m), op.model->chunk_bytes, tiers, in_gpu ? &in_gpu : nullptr);
    for (uint32_t t = 0; t < kTierCount; ++t) op.cqe.res[1 + t] += tiers[t];
    // Read-ahead: a lease usually follows a lookup; chunks it will need from the disk or the
    // remote tier start their way into the arena now.
    const uint32_t limit = read_ahead_limit(store);
    if ((tiers[kDisk] > 0 || tiers[kRemote] > 0) && op.read_ahead < limit)
      op.read_ahead += store.prefetch(std::span(keys, hits), op.model->chunk_bytes, limit - op.read_ahead);
    op.done += hits;
    // The prefix ends on this node: other nodes may have put the rest in the shared tier.
    if (hits < m && ask_remote(op, op.cursor + hits, n)) {
      op.cursor += hits;
      return Step::kWait;
    }
    op.cursor += m;
    stopped = hits < m;
    if (!stopped && op.cursor < n && past(deadline_ns)) return Step::kMore;
  }
  store.note_read(ReadOp::kLookup, op.cqe.res + 1, n - op.done);
  ipc::LookupOp::Result r;
  r.hit_chunks = uint32_t(op.done);
  for (uint32_t t = 0; t < kTierCount; ++t) r.tier_chunks[t] = uint32_t(op.cqe.res[1 + t]);
  ipc::LookupOp::put(r, op.cqe);
  return finish(op, OkStatus());
}

// ---- LOOKUP_EACH --------------------------------------------------------------------------------

Step RequestHandler::lookup_each(Op& op, uint64_t deadline_ns) {
  Session& s = *op.session;
  TieredStore& store = *s.ns->store;
  const uint32_t n = op.shape.in_records;
  kdn_key keys[kBatch];
  uint8_t out[kBatch];
  // Keys missing here may be in the shared tier: one round trip asks about all of them first.
  if (op.cursor == 0 && ask_remote(op, 0, n)) return Step::kWait;
  while (op.cursor < n) {
    const uint32_t first = op.cursor, m = std::min(kBatch, n - first);
    Status in = s.shm.payload().copy_in_slice(op.sqe, first, std::span(keys, m));
    if (!in.ok()) return finish(op, in);
    for (uint32_t i = 0; i < m; ++i) {
      const uint32_t t = store.probe(keys[i], op.model->chunk_bytes);
      out[i] = t < kTierCount ? uint8_t(t) : ipc::kTierMiss;
      if (t < kTierCount) {
        ++op.cqe.res[1 + t];
        ++op.done;
      }
    }
    Status wrote = s.shm.payload().copy_out_slice(op.sqe, first, std::span<const uint8_t>(out, m));
    if (!wrote.ok()) return finish(op, wrote);
    op.cursor += m;
    if (op.cursor < n && past(deadline_ns)) return Step::kMore;
  }
  store.note_read(ReadOp::kLookupEach, op.cqe.res + 1, n - op.done);
  ipc::LookupEachOp::Result r;
  r.hit_chunks = uint32_t(op.done);
  for (uint32_t t = 0; t < kTierCount; ++t) r.tier_chunks[t] = uint32_t(op.cqe.res[1 + t]);
  ipc::LookupEachOp::put(r, op.cqe);
  return finish(op, OkStatus());
}

// ---- RESERVE ----------------------------------------------------------------------------------

Step RequestHandler::reserve(Op& op, uint64_t deadline_ns) {
  Session& s = *op.session;
  TieredStore& store = *s.ns->store;
  const uint32_t n = op.shape.in_records;
  const uint64_t bytes = op.model->chunk_bytes;
  if (op.cursor == 0 && op.taken.empty()) {  // limits are checked before anything is taken
    if (!s.staging.valid()) return finish(op, Status(Code::kLimit, "a read-only session (no staging area) cannot store"));
    if (s.reservations.size() + n > config_.max_reservations)
      return finish(op, Status(Code::kLimit, "more open reservations than max_reservations"));
    if (uint64_t(n) * staging_slot(bytes) > s.staging.free_bytes())
      return finish(op, Status(Code::kLimit, "the reserved chunks do not fit the staging area"));
  }
  op.wants_room = false;
  kdn_key keys[kBatch];
  ipc::ReserveRecord out[kBatch];
  while (op.cursor < n) {
    const uint32_t first = op.cursor, m = std::min(kBatch, n - first);
    Status in = s.shm.payload().copy_in_slice(op.sqe, first, std::span(keys, m));
    if (!in.ok()) {
      rollback(op);
      return finish(op, in);
    }
    const uint64_t now = now_ns();
    make_room(op.taken, m);  // so a reservation it makes is always one it can roll back
    uint32_t filled = 0;
    Status stop;
    for (; filled < m; ++filled) {
      auto r = store.reserve(keys[filled], op.model->fingerprint, bytes, s.id, now);
      if (!r.ok()) {
        stop = r.status();
        break;
      }
      ipc::ReserveRecord& rec = out[filled];
      rec = ipc::ReserveRecord{};
      rec.state = uint32_t(r->outcome);
      if (r->outcome != TieredStore::ReserveOutcome::kReserved) continue;
      if (const ipc::ReserveOp::Args a = ipc::ReserveOp::args(op.sqe); a.chain_pos != 0) {
        r->entry->chain_head = a.chain_head;
        r->entry->chain_pos = a.chain_pos + op.cursor + filled;
      }
      std::optional<uint64_t> off;
      const uint64_t id = s.next_handle++;
      try {
        off = s.staging.allocate(bytes);
        if (off) {
          s.reservation_order.push_back(id);  // an id here without a reservation is skipped
          s.reservations.emplace(id, Reservation{r->entry, *off, now + uint64_t(config_.reservation_timeout_ms) * 1000000});
        }
      } catch (...) {
        if (off) s.staging.free(*off);
        store.abort(r->entry);
        throw;
      }
      if (!off) {  // free bytes sufficed but not in one piece
        store.abort(r->entry);
        rollback(op);
        return finish(op, Status(Code::kLimit, "the staging area is too fragmented for this chunk"));
      }
      op.taken.push_back(id);
      rec.slot = ipc::SlotRef{s.staging_region, 1, *off};
      rec.reservation_id = id;
    }
    Status wrote = s.shm.payload().copy_out_slice(op.sqe, first, std::span<const ipc::ReserveRecord>(out, filled));
    if (!wrote.ok()) {
      rollback(op);
      return finish(op, wrote);
    }
    op.cursor = first + filled;
    if (!stop.ok()) {
      if (stop.code() == Code::kInProgress) {  // room comes when demotions land
        if (op.room_deadline_ns == 0) op.room_deadline_ns = now + uint64_t(config_.room_wait_ms) * 1'000'000;
        if (now < op.room_deadline_ns) {
          op.wants_room = true;
          return Step::kWait;
        }
        stop = Status(Code::kNoSpace, "no room came in time");
      }
      if (stop.code() != Code::kNoSpace) {
        rollback(op);
        return finish(op, stop);
      }
      // A full arena ends the request here: the rest is not served, and says so.
      Status z = s.shm.payload().zero_out_records<ipc::ReserveRecord>(op.sqe, op.cursor, n);
      if (!z.ok()) {
        rollback(op);
        return finish(op, z);
      }
      ipc::ReserveOp::put({uint32_t(op.taken.size()), op.cursor, stop.raw()}, op.cqe);
      return finish(op, op.cursor > 0 ? OkStatus() : stop);
    }
    if (op.cursor < n && past(deadline_ns)) return Step::kMore;
  }
  ipc::ReserveOp::put({uint32_t(op.taken.size()), n, 0}, op.cqe);
  return finish(op, OkStatus());
}

// ---- COMMIT, ABORT ----------------------------------------------------------------------------

Step RequestHandler::commit(Op& op, uint64_t deadline_ns) {
  Session& s = *op.session;
  TieredStore& store = *s.ns->store;
  const uint32_t n = op.shape.in_records;
  uint64_t ids[kBatch];
  while (op.cursor < n) {
    const uint32_t m = std::min(kBatch, n - op.cursor);
    Status in = s.shm.payload().copy_in_slice(op.sqe, op.cursor, std::span(ids, m));
    if (!in.ok()) {
      op.first_error = in;
      op.cursor = n;
      break;
    }
    make_room(op.taken, m);  // may throw: before any change
    make_room(op.committed, m);
    for (uint32_t i = 0; i < m; ++i) {
      auto it = s.reservations.find(ids[i]);
      if (it == s.reservations.end()) {
        op.unknown_handle = true;
        continue;
      }
      const Reservation r = it->second;
      s.reservations.erase(it);
      Status st = store.commit(r.entry, s.staging.at(r.staging_offset), op.token, r.staging_offset);
      if (!st.ok()) {
        s.staging.free(r.staging_offset);
        if (op.first_error.ok()) op.first_error = st;
        continue;
      }
      ++op.waiting;
      op.taken.push_back(ids[i]);
      op.committed.push_back(r.entry->key);
    }
    op.cursor += m;
    if (op.cursor < n && past(deadline_ns)) return Step::kMore;
  }
  if (op.waiting > 0) return Step::kWait;
  if (!settle_backwards(op, op.committed, deadline_ns, [&](const kdn_key& k) { store.settle(k); })) return Step::kMore;
  ipc::CommitOp::put({uint32_t(op.done)}, op.cqe);
  if (!op.first_error.ok()) return finish(op, op.first_error);
  return finish(op, op.unknown_handle ? Status(Code::kNotFound, "unknown reservation id (never issued, finished or expired)")
                                      : OkStatus());
}

// ABORT and RELEASE: each id this session holds is finished by `finish_one`; an id it does not
// hold is skipped and makes the status KDN_ERR_NOT_FOUND.
template <class Holds, class FinishOne>
Step RequestHandler::finish_handles(Op& op, uint64_t deadline_ns, Holds holds, FinishOne finish_one,
                                    const char* unknown) {
  Session& s = *op.session;
  const uint32_t n = op.shape.in_records;
  uint64_t ids[kBatch];
  while (op.cursor < n) {
    const uint32_t m = std::min(kBatch, n - op.cursor);
    Status in = s.shm.payload().copy_in_slice(op.sqe, op.cursor, std::span(ids, m));
    if (!in.ok()) return finish(op, in);
    for (uint32_t i = 0; i < m; ++i) {
      if (!holds(ids[i])) {
        op.unknown_handle = true;
        continue;
      }
      finish_one(ids[i]);
      ++op.done;
    }
    op.cursor += m;
    if (op.cursor < n && past(deadline_ns)) return Step::kMore;
  }
  ipc::ReleaseOp::put({uint32_t(op.done)}, op.cqe);  // ABORT's result has the same shape
  return finish(op, op.unknown_handle ? Status(Code::kNotFound, unknown) : OkStatus());
}

Step RequestHandler::abort(Op& op, uint64_t deadline_ns) {
  Session& s = *op.session;
  return finish_handles(
      op, deadline_ns, [&](uint64_t id) { return s.reservations.count(id) != 0; },
      [&](uint64_t id) { abort_reservation(s, id); }, "unknown reservation id");
}

// ---- LEASE, RELEASE -----------------------------------------------------------------------------

// LEASE stops at the first miss (the prefix ends there); LEASE_EACH (`each`) writes a zero
// record for a miss and goes on. Every lease taken goes to op.taken (rollback, touch order);
// a miss takes nothing.
Step RequestHandler::lease(Op& op, uint64_t deadline_ns) {
  Session& s = *op.session;
  TieredStore& store = *s.ns->store;
  const bool segment = is_segment(op.sqe.opcode);
  const bool each = op.sqe.opcode == uint8_t(Opcode::kLeaseEach) || segment;
  const bool prefetch = op.sqe.opcode == uint8_t(Opcode::kGpuPrefetch);
  const bool gpu = op.sqe.opcode == uint8_t(Opcode::kGpuRetrieve) || prefetch || segment;  // leases kept by kdnd
  const uint32_t wanted =
      each       ? op.shape.in_records
      : prefetch ? ipc::GpuPrefetchOp::wanted(ipc::GpuPrefetchOp::args(op.sqe), op.shape.in_records)
      : gpu      ? ipc::GpuRetrieveOp::wanted(ipc::GpuRetrieveOp::args(op.sqe), op.shape.in_records)
                 : ipc::LeaseOp::wanted(ipc::LeaseOp::args(op.sqe), op.shape.in_records);
  if (gpu && !op.gpu) {
    Status prepared = gpu_prepare(op);
    if (!prepared.ok()) return finish(op, prepared);
  }
  const uint64_t bytes = op.model->chunk_bytes;
  kdn_key keys[kBatch];
  ipc::LeaseRecord out[kBatch];
  bool stopped = op.finishing;
  op.wants_room = false;
  while (op.cursor < wanted && !stopped) {
    const uint32_t first = op.cursor, m = std::min(kBatch, wanted - first);
    Status in = s.shm.payload().copy_in_slice(op.sqe, first, std::span(keys, m));
    if (!in.ok()) {
      rollback(op);
      return finish(op, in);
    }
    const uint64_t now = now_ns();
    uint32_t filled = 0;
    bool wait = false;
    for (; filled < m; ++filled) {
      if (first + filled == op.stop_at) {
        if (each) {  // its promotion failed: a miss here, go on with the next key
          out[filled] = ipc::LeaseRecord{};
          op.stop_at = UINT32_MAX;
          continue;
        }
        stopped = true;
        break;
      }
      Entry* e = store.index().find(keys[filled]);
      uint64_t id = 0;
      if (auto held = e && !gpu ? s.lease_ids.find(e) : s.lease_ids.end(); held != s.lease_ids.end()) {
        LeaseHold& h = s.leases[held->second];
        if (h.count >= config_.max_lease_count) {
          rollback(op);
          return finish(op, Status(Code::kLimit, "a chunk leased max_lease_count times by this session"));
        }
        make_room(op.taken, 1);
        ++h.count;
        id = held->second;
      } else {
        bool miss = false;
        switch (store.acquire(keys[filled], bytes, op.token, &e, now, &op.promoted_from)) {
          case TieredStore::Acquired::kMiss:
            // Not on this node: the shared tier is asked about this key and the rest, once.
            if (ask_remote(op, first + filled, wanted)) {
              wait = true;
              break;
            }
            miss = true;
            break;
          case TieredStore::Acquired::kNoRoomYet:
            if (op.room_deadline_ns == 0) op.room_deadline_ns = now + uint64_t(config_.room_wait_ms) * 1'000'000;
            if (now >= op.room_deadline_ns) {
              miss = true;  // no room came in time: the prefix ends here (LEASE_EACH: a miss)
              break;
            }
            op.wants_room = true;
            wait = true;
            break;
          case TieredStore::Acquired::kPromoting:
            if (op.waited_at == first + filled) {  // promoted once and gone again: a miss now
              miss = true;
              break;
            }
            op.waited_at = first + filled;
            ++op.waiting;
            store.prefetch(std::span(keys + filled + 1, m - filled - 1), bytes, read_ahead_limit(store));
            wait = true;
            break;
          case TieredStore::Acquired::kLeased:
            if (gpu) {  // the copies' own lease, released when they land
              try {
                op.gpu->leased.push_back(e);
                if (segment) op.gpu->position.push_back(first + filled);  // misses leave gaps
                make_room(op.taken, 1);
              } catch (...) {
                if (op.gpu->leased.empty() || op.gpu->leased.back() != e) store.unpin(e);
                throw;
              }
              break;
            }
            if (s.leases.size() >= config_.max_leases) {  // a new chunk past the limit: none of it
              store.unpin(e);
              rollback(op);
              return finish(op, Status(Code::kLimit, "more leased chunks than max_leases"));
            }
            id = s.next_handle++;
            try {
              s.leases.emplace(id, LeaseHold{e, 1});
              s.lease_ids.emplace(e, id);
              make_room(op.taken, 1);
            } catch (...) {
              s.leases.erase(id);
              s.lease_ids.erase(e);
              store.unpin(e);
              throw;
            }
            break;
        }
        if (miss && each) {
          out[filled] = ipc::LeaseRecord{};
          continue;
        }
        stopped = miss;
        if (stopped || wait) break;
      }
      op.taken.push_back(id);
      const bool promoted = op.waited_at == first + filled;  // it was brought up for this request
      const uint32_t from = tier_index(promoted ? op.promoted_from : TierId::kHost);
      ++op.served_from[from];
      out[filled] = ipc::LeaseRecord{arena_ref(s, e), id, from, 0};
    }
    Status wrote = gpu ? OkStatus()
                       : s.shm.payload().copy_out_slice(op.sqe, first, std::span<const ipc::LeaseRecord>(out, filled));
    if (!wrote.ok()) {
      rollback(op);
      return finish(op, wrote);
    }
    op.cursor = first + filled;
    if (wait) return Step::kWait;
    if (!stopped && op.cursor < wanted && past(deadline_ns)) return Step::kMore;
  }
  op.finishing = true;
  const uint64_t now = now_ns();
  const bool touched =
      gpu ? settle_backwards(op, op.gpu->leased, deadline_ns, [&](Entry* e) { store.touch(e, now); })
          : settle_backwards(op, op.taken, deadline_ns, [&](uint64_t id) {
              if (auto h = s.leases.find(id); h != s.leases.end()) store.touch(h->second.entry, now);
            });
  if (!touched) return Step::kMore;
  if (gpu) {
    if (prefetch) return gpu_queue_prefetch(op);  // not a read: the retrieve that follows counts
    store.note_read(segment ? ReadOp::kLeaseEach : ReadOp::kLease, op.served_from, wanted - op.taken.size());
    if (op.sqe.opcode == uint8_t(Opcode::kGpuBlendSelect)) return gpu_queue_blend(op);
    return segment ? gpu_queue_segment(op) : gpu_queue_retrieve(op);
  }
  Status z = s.shm.payload().zero_out_records<ipc::LeaseRecord>(op.sqe, op.cursor, wanted);
  if (!z.ok()) {
    rollback(op);
    return finish(op, z);
  }
  // A prefix LEASE counts the keys past the one it stopped at as misses, as LOOKUP does.
  store.note_read(each ? ReadOp::kLeaseEach : ReadOp::kLease, op.served_from, wanted - op.taken.size());
  if (each) ipc::LeaseEachOp::put({uint32_t(op.taken.size())}, op.cqe);
  else ipc::LeaseOp::put({uint32_t(op.taken.size())}, op.cqe);
  return finish(op, OkStatus());
}

Step RequestHandler::release(Op& op, uint64_t deadline_ns) {
  Session& s = *op.session;
  return finish_handles(
      op, deadline_ns, [&](uint64_t id) { return s.leases.count(id) != 0; },
      [&](uint64_t id) { release_lease(s, id, 1); }, "unknown lease id");
}

// ---- STATS, LIST, EVICT ----------------------------------------------------------------------

ipc::StatsRecord RequestHandler::stats(const Namespace& ns, bool admin) const noexcept {
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
  if (admin) {
    r.daemon_sessions = counters_.sessions_active;
    r.daemon_requests = counters_.requests;
    r.daemon_handshakes_refused = counters_.handshakes_refused;
    r.daemon_namespaces = counters_.namespaces;
  }
  return r;
}

Step RequestHandler::stats(Op& op) {
  Session& s = *op.session;
  const ipc::StatsRecord r = stats(*s.ns, s.admin);
  const uint32_t words = std::min<uint32_t>(op.shape.out_capacity, sizeof r / sizeof(uint64_t));
  Status out = s.shm.payload().copy_out(op.sqe.out_off, std::as_bytes(std::span(&r, 1)).first(words * sizeof(uint64_t)));
  if (!out.ok()) return finish(op, out);
  ipc::StatsOp::put({words}, op.cqe);
  return finish(op, OkStatus());
}

Step RequestHandler::list(Op& op) {
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

Step RequestHandler::evict(Op& op, uint64_t deadline_ns) {
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
      if (store.evict(keys[i])) ++op.done;
      else ++op.cqe.res[1];
    }
    op.cursor += m;
    if (op.cursor < n && past(deadline_ns)) return Step::kMore;
  }
  ipc::EvictOp::put({op.done, op.cqe.res[1]}, op.cqe);
  return finish(op, OkStatus());
}

// ---- PREFETCH, TIER_STATS -------------------------------------------------------------------------

Step RequestHandler::prefetch(Op& op, uint64_t deadline_ns) {
  Session& s = *op.session;
  TieredStore& store = *s.ns->store;
  const uint32_t n = op.shape.in_records;
  const uint64_t bytes = op.model->chunk_bytes;
  kdn_key keys[kBatch];
  bool stopped = false;
  while (op.cursor < n && !stopped) {
    const uint32_t m = std::min(kBatch, n - op.cursor);
    Status in = s.shm.payload().copy_in_slice(op.sqe, op.cursor, std::span(keys, m));
    if (!in.ok()) return finish(op, in);
    const uint32_t hits = store.cached_prefix(std::span(keys, m), bytes);
    if (op.read_ahead < config_.disk.prefetch_max_chunks)
      op.read_ahead += store.prefetch(std::span(keys, hits), bytes, config_.disk.prefetch_max_chunks - op.read_ahead);
    op.done += hits;
    if (hits < m && ask_remote(op, op.cursor + hits, n)) {
      op.cursor += hits;
      return Step::kWait;
    }
    op.cursor += m;
    stopped = hits < m;
    if (!stopped && op.cursor < n && past(deadline_ns)) return Step::kMore;
  }
  ipc::PrefetchOp::put({uint32_t(op.done), op.read_ahead}, op.cqe);
  return finish(op, OkStatus());
}

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
  if (const DiskTier* d = ns.disk.get()) {
    ipc::TierStatsRecord& r = out[kDisk];
    const DiskCounters& c = d->counters();
    const RingCounters rc = d->ring_counters();
    r.promoted_chunks = k.promoted_from_chunks[kDisk];
    r.promoted_bytes = k.promoted_from_bytes[kDisk];
    r.demoted_chunks = k.demoted_chunks;
    r.demoted_bytes = k.demoted_bytes;
    r.written_through_chunks = k.written_through_chunks;
    r.reads = c.reads;
    r.read_bytes = c.read_bytes;
    r.writes = c.writes;
    r.write_bytes = c.write_bytes;
    r.raw_bytes_written = c.raw_bytes_written;
    r.stored_bytes_written = c.stored_bytes_written;
    r.reencoded_chunks = c.reencoded;
    r.pending_reencode = d->pending_reencode();
    r.fault_io = c.io_errors;
    r.fault_no_space = c.no_space;
    r.fault_eof = c.end_of_file;
    r.fault_crc = c.crc_mismatch;
    r.fault_decode = c.decode_errors;
    r.retries = rc.retries;
    r.short_transfers = rc.short_transfers;
    r.recovered_chunks = k.recovered_chunks;
    r.queue_depth = config_.disk.queue_depth;
    r.codec = uint64_t(d->codec());
    r.flags = (d->buffers_registered() ? ipc::kTierStatsFixedBuffers : 0) |
              (d->degraded() ? ipc::kTierStatsDegraded : 0);
  }
  if (const RemoteTier* remote = ns.remote.get()) {
    ipc::TierStatsRecord& r = out[kRemote];
    const RemoteCounters& c = remote->counters();
    r.promoted_chunks = k.promoted_from_chunks[kRemote];
    r.promoted_bytes = k.promoted_from_bytes[kRemote];
    r.written_through_chunks = k.uploaded_chunks;  // uploads, at commit or as chunks leave memory
    r.reads = c.reads;
    r.read_bytes = c.read_bytes;
    r.writes = c.writes;
    r.write_bytes = c.write_bytes;
    r.fault_io = c.timeouts + c.unavailable + c.error_replies;
    r.fault_no_space = c.no_space;
    r.fault_eof = c.missing;  // the value is gone
    r.fault_crc = c.crc_mismatch + c.bad_header + c.bad_length + c.foreign + c.wrong_type;
    r.fault_decode = c.decode_errors;
    r.raw_bytes_written = c.write_bytes;
    r.stored_bytes_written = c.stored_bytes_written;
    r.recovered_chunks = k.remote_found_chunks;  // found by lookups on local misses
  }
  return out;
}

Step RequestHandler::metrics(Op& op) {
  Session& s = *op.session;
  if (!render_metrics_) return finish(op, Status(Code::kUnsupported, "this kdnd renders no metrics page"));
  const std::string page = render_metrics_();  // bad_alloc ends this request alone (step catches it)
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

Step RequestHandler::tier_stats(Op& op) {
  Session& s = *op.session;
  const auto records = tier_stats(*s.ns);
  const uint32_t n = std::min<uint32_t>(op.shape.out_capacity, kTierCount);
  Status out = s.shm.payload().copy_out_records(op.sqe, std::span<const ipc::TierStatsRecord>(records.data(), n));
  if (!out.ok()) return finish(op, out);
  ipc::TierStatsOp::put({n}, op.cqe);
  return finish(op, OkStatus());
}

}  // namespace kdn::sidecar

// ---- the GPU tier (docs/gpu.md) --------------------------------------------------------------------

namespace kdn::sidecar {

namespace {
constexpr Status kNoGpuTier(Code::kUnsupported, "this kdnd has no GPU tier");
}  // namespace

Step RequestHandler::gpu_register(Op& op) {
  if (gpu_ == nullptr) return finish(op, kNoGpuTier);
  ipc::GpuRegisterRecord rec;
  auto in = op.session->shm.payload().copy_in_records(op.sqe, std::span(&rec, 1));
  if (!in.ok()) return finish(op, in.status());
  auto out = gpu_->register_memory(*op.session, rec);
  if (!out.ok()) return finish(op, out.status());
  Status wrote = op.session->shm.payload().copy_out_records(op.sqe, std::span<const ipc::GpuRegisteredRecord>(&*out, 1));
  if (!wrote.ok()) {
    (void)gpu_->unregister(*op.session, {out->registration, out->generation});
    return finish(op, wrote);
  }
  ipc::GpuRegisterOp::put({out->registration, out->generation, out->device}, op.cqe);
  return finish(op, OkStatus());
}

Step RequestHandler::gpu_unregister(Op& op) {
  if (gpu_ == nullptr) return finish(op, kNoGpuTier);
  return finish(op, gpu_->unregister(*op.session, ipc::GpuUnregisterOp::args(op.sqe).reg));
}

Step RequestHandler::gpu_info(Op& op) {
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
      g.flags = (d.info.vmm_supported ? ipc::kGpuDeviceVmm : 0) | (d.info.posix_fd_handles ? ipc::kGpuDevicePosixFd : 0);
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

// Checks a GPU request's registration and layout before anything is taken.
Status RequestHandler::gpu_prepare(Op& op) {
  if (gpu_ == nullptr) return kNoGpuTier;
  Session& s = *op.session;
  const bool store = op.sqe.opcode == uint8_t(Opcode::kGpuStore);
  const bool blend = op.sqe.opcode == uint8_t(Opcode::kGpuBlendSelect);
  const bool segment = is_segment(op.sqe.opcode);
  if (op.sqe.opcode == uint8_t(Opcode::kGpuPrefetch)) {  // no layout: nothing reaches the engine
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
  KDN_RETURN_IF_ERROR(op.session->shm.payload().copy_in(where.off, std::as_writable_bytes(std::span(req.segment_chunks))));
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
  std::vector<Entry*> keep = w.chunks;  // (may throw: nothing given back yet)
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
  auto from_t0 = gpu_->retrieve(*s.ns, *w.reg, op.gpu->layout, kernels::chunk_geometry_of(*op.model), w.chunks,
                                &w.placement);
  if (!from_t0.ok()) return finish(op, from_t0.status());
  ipc::GpuSegmentRetrieveOp::put({n, *from_t0, gpu_->last_ticket()}, op.cqe);
  return finish(op, OkStatus());
}

Step RequestHandler::gpu_blend(Op& op, uint64_t deadline_ns) {
  if (!op.gpu || op.gpu->phase != gpu::GpuRequest::Phase::kCopying) return lease(op, deadline_ns);
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

Step RequestHandler::gpu_store(Op& op, uint64_t deadline_ns) {
  if (!op.gpu) {
    Status prepared = gpu_prepare(op);
    if (!prepared.ok()) return finish(op, prepared);
  }
  switch (op.gpu->phase) {
    case gpu::GpuRequest::Phase::kCollect: return gpu_collect(op, deadline_ns);
    case gpu::GpuRequest::Phase::kCopying:
      if (op.waiting > 0) return Step::kWait;
      op.gpu->phase = gpu::GpuRequest::Phase::kCommitting;
      [[fallthrough]];
    case gpu::GpuRequest::Phase::kCommitting:
    case gpu::GpuRequest::Phase::kSettling: return gpu_commit(op, deadline_ns);
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
          if (op.room_deadline_ns == 0) op.room_deadline_ns = now + uint64_t(config_.room_wait_ms) * 1'000'000;
          if (now < op.room_deadline_ns) {
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
  Status queued = gpu_->store(*s.ns, **reg, g.layout, kernels::chunk_geometry_of(*op.model), g.reserved, g.position,
                              op.token);
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
  gpu_->encode_stored(s, g.ref, *s.ns, kernels::chunk_geometry_of(*op.model), g.committed);  // T0 with a codec
  ipc::GpuStoreOp::put({uint32_t(op.done), g.cached}, op.cqe);
  return finish(op, op.first_error);
}

// GPU_CHECK: answers once the registration's batches behind the tickets have landed.
Step RequestHandler::gpu_check(Op& op) {
  if (op.waiting > 0) return Step::kWait;
  if (gpu_ == nullptr) return finish(op, kNoGpuTier);
  const ipc::GpuCheckOp::Args a = ipc::GpuCheckOp::args(op.sqe);
  auto reg = gpu_->find(*op.session, a.reg);
  if (!reg.ok()) return finish(op, reg.status());
  uint64_t wait_on = 0;
  switch (gpu_->check_tickets(**reg, a.first, a.last, &wait_on)) {
    case gpu::GpuService::Tickets::kOk: return finish(op, OkStatus());
    case gpu::GpuService::Tickets::kFailed:
      return finish(op, Status(Code::kIo, "a GPU copy behind these tickets failed: the blocks hold bytes kdnd did not write"));
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
