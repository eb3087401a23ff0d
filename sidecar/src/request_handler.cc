#include "request_handler.h"

#include <kdn/common/clock.h>
#include <kdn/ipc/payload.h>

#include <algorithm>
#include <cstring>

namespace kdn::sidecar {

using ipc::Opcode;

void Session::drop_holdings() {
  if (!ns) return;
  for (auto& [id, e] : leases) ns->store.release(e);
  for (auto& [id, e] : reservations) (void)ns->store.abort(e, this->id);
  leases.clear();
  reservations.clear();
}

Result<uint32_t> ModelTable::intern(const ModelInfo& m) {
  for (size_t i = 0; i < models_.size(); ++i)
    if (models_[i].fingerprint == m.fingerprint) return static_cast<uint32_t>(i + 1);
  if (models_.size() >= kMaxModels) return Status(Code::kNoSpace, "model table full");
  models_.push_back(m);
  return static_cast<uint32_t>(models_.size());
}

RequestHandler::RequestHandler(ModelTable& models, DaemonCounters& counters)
    : models_(models), counters_(counters) {
  keys_.resize(ipc::kMaxKeysPerOp);
  ids_.resize(ipc::kMaxKeysPerOp);
  reserve_out_.resize(ipc::kMaxKeysPerOp);
  lease_out_.resize(ipc::kMaxKeysPerOp);
  leased_.resize(ipc::kMaxKeysPerOp);
  list_out_.resize(ipc::kMaxKeysPerOp);
}

ipc::Cqe RequestHandler::handle(Session& s, const ipc::Sqe& q) {
  Cqe c{};
  c.user_data = q.user_data;
  ++s.requests;
  ++counters_.requests;
  Status st = [&]() -> Status {
    auto shape = ipc::check_sqe(q, s.shm.payload().size(), s.admin);
    if (!shape.ok()) return shape.status();
    switch (static_cast<Opcode>(q.opcode)) {
      case Opcode::kPing: return ping(q, c);
      case Opcode::kRegisterModel: return register_model(s, q, c);
      case Opcode::kLookup: return lookup(s, q, c);
      case Opcode::kReserve: return reserve(s, q, c);
      case Opcode::kCommit: return commit_or_abort(s, q, c, true);
      case Opcode::kAbort: return commit_or_abort(s, q, c, false);
      case Opcode::kLease: return lease(s, q, c);
      case Opcode::kRelease: return release(s, q, c);
      case Opcode::kStats: return stats(s, q, c);
      case Opcode::kList: return list(s, q, c);
      case Opcode::kEvict: return evict(s, q, c);
    }
    return Status(Code::kUnsupported, "unknown opcode");
  }();
  if (st.code() == Code::kProtocol) {
    ++s.protocol_errors;
    ++counters_.protocol_errors;
  }
  c.status = st.raw();
  return c;
}

Result<const ModelInfo*> RequestHandler::model_of(const Session& s, const Sqe& q) const {
  if (std::find(s.models.begin(), s.models.end(), q.model_id) == s.models.end())
    return Status(Code::kNotFound, "model_id not registered by this session");
  return models_.get(q.model_id);
}

Result<std::span<kdn_key>> RequestHandler::keys_in(const Session& s, const Sqe& q) {
  return s.shm.payload().copy_in_records(q, std::span<kdn_key>(keys_));
}

Result<std::span<uint64_t>> RequestHandler::ids_in(const Session& s, const Sqe& q) {
  return s.shm.payload().copy_in_records(q, std::span<uint64_t>(ids_));
}

Status RequestHandler::ping(const Sqe& q, Cqe& c) {
  c.res[0] = q.arg[0];
  return OkStatus();
}

Status RequestHandler::register_model(Session& s, const Sqe& q, Cqe& c) {
  kdn_model_desc d;
  KDN_RETURN_IF_ERROR(s.shm.payload().copy_in(q.in_off, std::as_writable_bytes(std::span(&d, 1))));
  auto info = ModelInfo::from_desc(d);
  if (!info.ok()) return info.status();
  auto id = models_.intern(*info);
  if (!id.ok()) return id.status();
  if (std::find(s.models.begin(), s.models.end(), *id) == s.models.end()) {
    if (s.models.size() >= 64) return Status(Code::kNoSpace, "at most 64 models per session");
    s.models.push_back(*id);
  }
  c.res[0] = *id;
  c.res[1] = info->chunk_bytes;
  c.res[2] = info->chunk_tokens;
  c.res[3] = info->fingerprint.lo;
  c.res[4] = info->fingerprint.hi;
  return OkStatus();
}

Status RequestHandler::lookup(Session& s, const Sqe& q, Cqe& c) {
  auto m = model_of(s, q);
  if (!m.ok()) return m.status();
  auto keys = keys_in(s, q);
  if (!keys.ok()) return keys.status();
  const uint32_t hits = s.ns->store.lookup(*keys, (*m)->chunk_bytes);
  c.res[0] = hits;
  c.res[1 + 1] = hits;  // every hit is in the host tier (tier 1)
  return OkStatus();
}

Status RequestHandler::reserve(Session& s, const Sqe& q, Cqe& c) {
  auto m = model_of(s, q);
  if (!m.ok()) return m.status();
  auto keys = keys_in(s, q);
  if (!keys.ok()) return keys.status();
  const uint64_t now = now_ns();
  uint32_t filled = 0, reserved = 0;
  Status stop;
  for (const kdn_key& k : *keys) {
    auto r = s.ns->store.reserve(k, (*m)->fingerprint, (*m)->chunk_bytes, s.id, now);
    if (!r.ok()) {
      stop = r.status();
      break;
    }
    ipc::ReserveSlot& slot = reserve_out_[filled++];
    slot = ipc::ReserveSlot{};
    slot.state = static_cast<uint32_t>(r->outcome);
    if (r->outcome == ChunkStore::ReserveOutcome::kReserved) {
      const uint64_t id = s.next_handle++;
      s.reservations.emplace(id, r->entry);
      slot.arena_off = r->entry->arena_off;
      slot.reservation_id = id;
      ++reserved;
    }
  }
  Status out = s.ns->arena.valid() ? s.shm.payload().copy_out_records(
                                         q, std::span<const ipc::ReserveSlot>(reserve_out_.data(), filled))
                                   : Status(Code::kInternal, "namespace without arena");
  if (!out.ok()) {
    // The client cannot learn its reservation ids: take them back.
    for (uint32_t i = 0; i < filled; ++i) {
      auto it = s.reservations.find(reserve_out_[i].reservation_id);
      if (reserve_out_[i].reservation_id && it != s.reservations.end()) {
        (void)s.ns->store.abort(it->second, s.id);
        s.reservations.erase(it);
      }
    }
    return out;
  }
  c.res[0] = reserved;
  c.res[1] = filled;  // records written; the rest got no slot (res2 says why)
  c.res[2] = stop.ok() ? 0 : static_cast<uint64_t>(-stop.raw());
  if (!stop.ok() && filled == 0) return stop;
  return OkStatus();
}

Status RequestHandler::commit_or_abort(Session& s, const Sqe& q, Cqe& c, bool commit) {
  auto ids = ids_in(s, q);
  if (!ids.ok()) return ids.status();
  const uint64_t now = now_ns();
  uint64_t done = 0;
  // Clients list a chain's chunks head first; commit them tail first so the head ends up the
  // most recently inserted (see ChunkStore::touch).
  for (auto rit = ids->rbegin(); rit != ids->rend(); ++rit) {
    const uint64_t id = *rit;
    auto it = s.reservations.find(id);
    if (it == s.reservations.end()) continue;
    Status st = commit ? s.ns->store.commit(it->second, s.id, now) : s.ns->store.abort(it->second, s.id);
    if (st.ok()) ++done;
    s.reservations.erase(it);
  }
  c.res[0] = done;
  return done == ids->size() ? OkStatus() : Status(Code::kNotFound, "unknown reservation id");
}

Status RequestHandler::lease(Session& s, const Sqe& q, Cqe& c) {
  auto m = model_of(s, q);
  if (!m.ok()) return m.status();
  auto keys = keys_in(s, q);
  if (!keys.ok()) return keys.status();
  size_t max = keys->size();
  if (q.arg[0] != 0 && q.arg[0] < max) max = static_cast<size_t>(q.arg[0]);
  const uint64_t now = now_ns();
  uint32_t n = 0;
  for (size_t i = 0; i < max; ++i) {
    ChunkEntry* e = s.ns->store.lease((*keys)[i], (*m)->chunk_bytes, now);
    if (!e) break;
    const uint64_t id = s.next_handle++;
    s.leases.emplace(id, e);
    leased_[n] = e;
    lease_out_[n++] = ipc::LeaseSlot{e->arena_off, id};
  }
  for (uint32_t i = n; i-- > 0;) s.ns->store.touch(leased_[i], now);  // head last: most recent
  Status out = s.shm.payload().copy_out_records(q, std::span<const ipc::LeaseSlot>(lease_out_.data(), n));
  if (!out.ok()) {
    for (uint32_t i = 0; i < n; ++i) {
      auto it = s.leases.find(lease_out_[i].lease_id);
      s.ns->store.release(it->second);
      s.leases.erase(it);
    }
    return out;
  }
  c.res[0] = n;
  return OkStatus();
}

Status RequestHandler::release(Session& s, const Sqe& q, Cqe& c) {
  auto ids = ids_in(s, q);
  if (!ids.ok()) return ids.status();
  uint64_t done = 0;
  for (uint64_t id : *ids) {
    auto it = s.leases.find(id);
    if (it == s.leases.end()) continue;
    s.ns->store.release(it->second);
    s.leases.erase(it);
    ++done;
  }
  c.res[0] = done;
  return done == ids->size() ? OkStatus() : Status(Code::kNotFound, "unknown lease id");
}

Status RequestHandler::stats(Session& s, const Sqe& q, Cqe& c) {
  const ChunkStoreCounters& k = s.ns->store.counters();
  kdn_stats st{};
  st.lookups = k.lookups;
  st.lookup_hit_chunks = k.lookup_hit_chunks;
  st.lookup_miss_chunks = k.lookup_miss_chunks;
  st.stored_chunks = k.stored_chunks;
  st.stored_bytes = k.stored_bytes;
  st.retrieved_chunks = k.retrieved_chunks;
  st.retrieved_bytes = k.retrieved_bytes;
  st.evicted_chunks = k.evicted_chunks;
  st.resident_chunks = s.ns->store.resident_chunks();
  st.resident_bytes = s.ns->store.resident_bytes();
  st.capacity_bytes = s.ns->store.capacity_bytes();
  st.active_leases = k.active_leases;
  st.open_reservations = k.open_reservations;
  st.sessions = counters_.sessions_active;
  st.protocol_errors = counters_.protocol_errors;
  c.res[0] = 1;
  return s.shm.payload().copy_out_records(q, std::span<const kdn_stats>(&st, 1));
}

Status RequestHandler::list(Session& s, const Sqe& q, Cqe& c) {
  const uint64_t cursor = q.arg[0];
  const uint32_t cap = std::min<uint32_t>(q.out_len / sizeof(ipc::ListEntry), ipc::kMaxKeysPerOp);
  uint64_t index = 0;
  uint32_t n = 0;
  bool more = false;
  s.ns->store.for_each([&](const ChunkEntry& e) {
    if (index++ < cursor) return true;
    if (n == cap) {
      more = true;
      return false;
    }
    ipc::ListEntry& o = list_out_[n++];
    o = ipc::ListEntry{};
    o.key = e.key;
    o.model_id = 0;
    for (uint32_t id = 1; const ModelInfo* mi = models_.get(id); ++id)
      if (mi->fingerprint == e.fingerprint) { o.model_id = id; break; }
    o.tier = e.tier;
    o.state = static_cast<uint8_t>(e.state);
    o.leases = e.leases;
    o.bytes = e.bytes;
    o.last_access = e.last_access_ns;
    return true;
  });
  KDN_RETURN_IF_ERROR(s.shm.payload().copy_out_records(q, std::span<const ipc::ListEntry>(list_out_.data(), n)));
  c.res[0] = n;
  c.res[1] = more ? cursor + n : 0;
  return OkStatus();
}

Status RequestHandler::evict(Session& s, const Sqe& q, Cqe& c) {
  const auto mode = static_cast<ipc::EvictMode>(q.arg[0]);
  if (mode == ipc::EvictMode::kAll) {
    uint64_t before = s.ns->store.resident_chunks();
    c.res[0] = s.ns->store.evict_if({});
    c.res[1] = before - c.res[0];
    return OkStatus();
  }
  if (mode != ipc::EvictMode::kByKeys) return Status(Code::kInvalidArgument, "unknown evict mode");
  auto keys = keys_in(s, q);
  if (!keys.ok()) return keys.status();
  uint64_t evicted = 0, skipped = 0;
  for (const kdn_key& k : *keys) {
    const ChunkEntry* e = s.ns->store.find(k);
    if (!e) continue;
    if (!e->evictable()) { ++skipped; continue; }
    evicted += s.ns->store.evict(k);
  }
  c.res[0] = evicted;
  c.res[1] = skipped;
  return OkStatus();
}

}  // namespace kdn::sidecar
