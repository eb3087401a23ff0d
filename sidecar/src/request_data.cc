// The data opcodes: PING, REGISTER_MODEL, the lookups and PREFETCH, and the store's two phases
// (RESERVE, COMMIT, ABORT) with RELEASE beside ABORT (both give handles back).
#include "request_handler.h"

#include "gpu/gpu_service.h"
#include "request_slices.h"

#include <kdn/ipc/ops.h>

#include <algorithm>
#include <cstring>

namespace kdn::sidecar {

namespace {

constexpr uint64_t kStagingAlign = StagingArea::kAlign;
// Keys one remote lookup asks about: a 256K-token prompt at 256 tokens a chunk.
constexpr uint32_t kMaxRemoteProbeKeys = 1024;

uint64_t staging_slot(uint64_t bytes) { return (bytes + kStagingAlign - 1) / kStagingAlign * kStagingAlign; }

// LOOKUP's and LOOKUP_EACH's answer: the hits, and per tier those whose fastest copy is there.
template <class LookupResult>
LookupResult lookup_result(const Op& op) {
  LookupResult r;
  r.hit_chunks = uint32_t(op.done);
  for (uint32_t t = 0; t < kTierCount; ++t) r.tier_chunks[t] = uint32_t(op.read.per_tier[t]);
  return r;
}

}  // namespace

// ---- what the reads share ------------------------------------------------------------------------

bool RequestHandler::ask_remote(Op& op, uint32_t at, uint32_t end) {
  TieredStore& store = *op.session->ns->store;
  if (op.read.remote_asked || store.remote() == nullptr || at >= end) return false;
  op.read.remote_asked = true;
  std::vector<kdn_key> keys(std::min(end - at, kMaxRemoteProbeKeys));
  if (!op.session->shm.payload().copy_in_slice(op.sqe, at, std::span(keys)).ok()) return false;
  if (!store.probe_remote(keys, op.model->fingerprint, op.model->chunk_bytes, op.token).ok()) return false;
  ++op.waiting;
  return true;
}

uint32_t RequestHandler::read_ahead_limit(const TieredStore& store) const noexcept {
  return store.remote() ? std::max(config_.disk.read_ahead, config_.remote.read_ahead) : config_.disk.read_ahead;
}

// ---- PING, REGISTER_MODEL ---------------------------------------------------------------------

Step RequestHandler::serve(Op& op, uint64_t, ipc::PingOp) {
  ipc::PingOp::put(ipc::PingOp::Result{ipc::PingOp::args(op.sqe).cookie}, op.cqe);
  return finish(op, OkStatus());
}

Step RequestHandler::serve(Op& op, uint64_t, ipc::RegisterModelOp) {
  Session& s = *op.session;
  ipc::ModelRecord rec;
  Status in = s.shm.payload().copy_in(op.sqe.in_off, std::as_writable_bytes(std::span(&rec, 1)));
  if (!in.ok()) return finish(op, in);
  if (rec.reserved != 0) return finish(op, Status(Code::kProtocol, "ModelRecord reserved field is not zero"));
  // The document promises a NUL-terminated name; taking 64 bytes without one would name the
  // model by a truncation the client never sent.
  if (std::memchr(rec.name, 0, sizeof rec.name) == nullptr)
    return finish(op, Status(Code::kProtocol, "ModelRecord name has no NUL"));
  auto info = ModelInfo::from_desc(ipc::from_wire(rec));
  if (!info.ok()) return finish(op, info.status());
  uint32_t id = models_.id_of(info->fingerprint);
  const bool mine = id != 0 && std::find(s.models.begin(), s.models.end(), id) != s.models.end();
  if (!mine) {
    if (s.models.size() >= config_.max_models)
      return finish(op, Status(Code::kLimit, "this session registered max_models models"));
    s.models.reserve(s.models.size() + 1);  // may throw: before the table takes a reference
    auto got = models_.acquire(*info, s.uid, s.ns->region_id);
    if (!got.ok()) return finish(op, got.status());
    id = *got;
    s.models.push_back(id);
  }
  s.ns->for_each_lower([&](Tier& t) { t.learn_model(*info); });  // its demotions and uploads can be encoded now
  ipc::RegisterModelOp::put({id, info->chunk_bytes, info->chunk_tokens, info->fingerprint}, op.cqe);
  return finish(op, OkStatus());
}

// ---- LOOKUP -----------------------------------------------------------------------------------

Step RequestHandler::serve(Op& op, uint64_t deadline_ns, ipc::LookupOp) {
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
    if (gpu_ != nullptr && gpu_->holds_any()) in_gpu = [&](const Entry& e) { return gpu_->holds(s.ns->region_id, e); };
    const uint32_t hits = store.lookup(std::span(keys, m), op.model->chunk_bytes, tiers, in_gpu ? &in_gpu : nullptr);
    for (uint32_t t = 0; t < kTierCount; ++t) op.read.per_tier[t] += tiers[t];
    // Read-ahead: a lease usually follows a lookup; chunks it will need from the disk or the
    // remote tier start their way into the arena now.
    const uint32_t limit = read_ahead_limit(store);
    if ((tiers[kDisk] > 0 || tiers[kRemote] > 0) && op.read.read_ahead < limit)
      op.read.read_ahead += store.prefetch(std::span(keys, hits), op.model->chunk_bytes, limit - op.read.read_ahead);
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
  store.note_read(ReadOp::kLookup, op.read.per_tier, n - op.done);
  ipc::LookupOp::put(lookup_result<ipc::LookupOp::Result>(op), op.cqe);
  return finish(op, OkStatus());
}

// ---- LOOKUP_EACH --------------------------------------------------------------------------------

Step RequestHandler::serve(Op& op, uint64_t deadline_ns, ipc::LookupEachOp) {
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
        ++op.read.per_tier[t];
        ++op.done;
      }
    }
    Status wrote = s.shm.payload().copy_out_slice(op.sqe, first, std::span<const uint8_t>(out, m));
    if (!wrote.ok()) return finish(op, wrote);
    op.cursor += m;
    if (op.cursor < n && past(deadline_ns)) return Step::kMore;
  }
  store.note_read(ReadOp::kLookupEach, op.read.per_tier, n - op.done);
  ipc::LookupEachOp::put(lookup_result<ipc::LookupEachOp::Result>(op), op.cqe);
  return finish(op, OkStatus());
}

// ---- RESERVE ----------------------------------------------------------------------------------

Step RequestHandler::serve(Op& op, uint64_t deadline_ns, ipc::ReserveOp) {
  Session& s = *op.session;
  TieredStore& store = *s.ns->store;
  const uint32_t n = op.shape.in_records;
  const uint64_t bytes = op.model->chunk_bytes;
  if (op.cursor == 0 && op.taken.empty()) {  // limits are checked before anything is taken
    if (!s.staging.valid())
      return finish(op, Status(Code::kLimit, "a read-only session (no staging area) cannot store"));
    if (s.reservations.size() + n > config_.max_reservations)
      return finish(op, Status(Code::kLimit, "more open reservations than max_reservations"));
    if (uint64_t(n) * staging_slot(bytes) > s.staging.free_bytes())
      return finish(op, Status(Code::kLimit, "the reserved chunks do not fit the staging area"));
  }
  op.wants_room = false;
  s.ns->writers.insert(&s);  // may throw: before anything is taken
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
      auto r = reserve_fairly(s, keys[filled], op.model->fingerprint, bytes, now);
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
          s.reservations.emplace(id,
                                 Reservation{r->entry, *off, now + uint64_t(config_.reservation_timeout_ms) * 1000000});
          s.reserved_bytes += bytes;
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
        if (!room_wait_over(op, now, config_.room_wait_ms)) {
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

// ---- COMMIT, ABORT, RELEASE-------------------------------------------------------------------------

Step RequestHandler::serve(Op& op, uint64_t deadline_ns, ipc::CommitOp) {
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
      forget_reserved(s, r);
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
  return finish(op, op.unknown_handle
                        ? Status(Code::kNotFound, "unknown reservation id (never issued, finished or expired)")
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

Step RequestHandler::serve(Op& op, uint64_t deadline_ns, ipc::AbortOp) {
  Session& s = *op.session;
  return finish_handles(
      op, deadline_ns, [&](uint64_t id) { return s.reservations.count(id) != 0; },
      [&](uint64_t id) { abort_reservation(s, id); }, "unknown reservation id");
}

Step RequestHandler::serve(Op& op, uint64_t deadline_ns, ipc::ReleaseOp) {
  Session& s = *op.session;
  return finish_handles(
      op, deadline_ns, [&](uint64_t id) { return s.leases.count(id) != 0; },
      [&](uint64_t id) { release_lease(s, id, 1); }, "unknown lease id");
}

// ---- PREFETCH -----------------------------------------------------------------------------------

Step RequestHandler::serve(Op& op, uint64_t deadline_ns, ipc::PrefetchOp) {
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
    if (op.read.read_ahead < config_.disk.prefetch_max_chunks)
      op.read.read_ahead +=
          store.prefetch(std::span(keys, hits), bytes, config_.disk.prefetch_max_chunks - op.read.read_ahead);
    op.done += hits;
    if (hits < m && ask_remote(op, op.cursor + hits, n)) {
      op.cursor += hits;
      return Step::kWait;
    }
    op.cursor += m;
    stopped = hits < m;
    if (!stopped && op.cursor < n && past(deadline_ns)) return Step::kMore;
  }
  ipc::PrefetchOp::put({uint32_t(op.done), op.read.read_ahead}, op.cqe);
  return finish(op, OkStatus());
}

}  // namespace kdn::sidecar
