#include "chunk_store.h"

namespace kdn::sidecar {

ChunkStore::ChunkStore(uint64_t arena_bytes, uint64_t slab_bytes, EvictionKind eviction)
    : alloc_(arena_bytes, slab_bytes), policy_(make_eviction_policy(eviction)) {}

const ChunkEntry* ChunkStore::find(const kdn_key& key) const {
  auto it = index_.find(key);
  return it == index_.end() ? nullptr : it->second.get();
}

uint32_t ChunkStore::lookup(std::span<const kdn_key> keys, uint64_t bytes) {
  ++counters_.lookups;
  uint32_t hits = 0;
  for (const kdn_key& k : keys) {
    auto it = index_.find(k);
    if (it == index_.end()) break;
    ChunkEntry* e = it->second.get();
    if (e->state != ChunkState::kCommitted || e->bytes != bytes) break;
    ++hits;
  }
  counters_.lookup_hit_chunks += hits;
  counters_.lookup_miss_chunks += keys.size() - hits;
  return hits;
}

std::optional<uint64_t> ChunkStore::alloc_slot(uint16_t cls) {
  if (auto off = alloc_.alloc(cls)) return off;
  // Same class first: one eviction frees exactly the slot we need.
  while (ChunkEntry* v = policy_->victim(cls)) {
    erase(v);
    ++counters_.evicted_chunks;
    if (auto off = alloc_.alloc(cls)) return off;
  }
  // Other classes: evict least-recently-used tails until a whole slab comes free.
  while (ChunkEntry* v = policy_->victim_any()) {
    erase(v);
    ++counters_.evicted_chunks;
    if (auto off = alloc_.alloc(cls)) return off;
  }
  return std::nullopt;
}

Result<ChunkStore::Reservation> ChunkStore::reserve(const kdn_key& key, const kdn_key& fingerprint,
                                                    uint64_t bytes, uint64_t session,
                                                    uint64_t now_ns) {
  if (auto it = index_.find(key); it != index_.end()) {
    const bool committed = it->second->state == ChunkState::kCommitted;
    return Reservation{committed ? ReserveOutcome::kAlreadyCached : ReserveOutcome::kInFlight,
                       nullptr};
  }
  auto cls = alloc_.class_for(bytes);
  if (!cls) return Status(Code::kInvalidArgument, "chunk larger than the host arena");
  auto off = alloc_slot(*cls);
  if (!off) return Status(Code::kNoSpace, "host arena full of leased or reserved chunks");
  auto e = std::make_unique<ChunkEntry>();
  e->key = key;
  e->fingerprint = fingerprint;
  e->arena_off = *off;
  e->bytes = bytes;
  e->size_class = *cls;
  e->owner_session = session;
  e->last_access_ns = now_ns;
  e->state = ChunkState::kReserved;
  ChunkEntry* raw = e.get();
  index_.emplace(key, std::move(e));
  ++counters_.open_reservations;
  return Reservation{ReserveOutcome::kReserved, raw};
}

Status ChunkStore::commit(ChunkEntry* e, uint64_t session, uint64_t now_ns) {
  if (e->state != ChunkState::kReserved || e->owner_session != session)
    return Status(Code::kNotFound, "not a reservation of this session");
  e->state = ChunkState::kCommitted;
  e->owner_session = 0;
  e->last_access_ns = now_ns;
  --counters_.open_reservations;
  ++counters_.stored_chunks;
  counters_.stored_bytes += e->bytes;
  ++resident_chunks_;
  resident_bytes_ += e->bytes;
  policy_->on_insert(e);
  return OkStatus();
}

Status ChunkStore::abort(ChunkEntry* e, uint64_t session) {
  if (e->state != ChunkState::kReserved || e->owner_session != session)
    return Status(Code::kNotFound, "not a reservation of this session");
  --counters_.open_reservations;
  ++counters_.aborted_chunks;
  erase(e);
  return OkStatus();
}

ChunkEntry* ChunkStore::lease(const kdn_key& key, uint64_t bytes, uint64_t now_ns) {
  auto it = index_.find(key);
  if (it == index_.end()) return nullptr;
  ChunkEntry* e = it->second.get();
  if (e->state != ChunkState::kCommitted || e->bytes != bytes) return nullptr;
  ++e->leases;
  e->last_access_ns = now_ns;
  ++counters_.active_leases;
  ++counters_.retrieved_chunks;
  counters_.retrieved_bytes += e->bytes;
  return e;
}

void ChunkStore::touch(ChunkEntry* e, uint64_t now_ns) {
  e->last_access_ns = now_ns;
  policy_->on_access(e);
}

void ChunkStore::release(ChunkEntry* e) {
  if (e->leases == 0) return;  // callers only pass entries they leased; stay safe regardless
  --e->leases;
  --counters_.active_leases;
}

void ChunkStore::erase(ChunkEntry* e) {
  if (e->state == ChunkState::kCommitted) {
    --resident_chunks_;
    resident_bytes_ -= e->bytes;
  }
  policy_->on_remove(e);
  alloc_.free(e->size_class, e->arena_off);
  const kdn_key key = e->key;  // erase by a copy: the entry owns the original
  index_.erase(key);           // destroys *e
}

bool ChunkStore::evict(const kdn_key& key) {
  auto it = index_.find(key);
  if (it == index_.end() || !it->second->evictable()) return false;
  erase(it->second.get());
  ++counters_.evicted_chunks;
  return true;
}

uint64_t ChunkStore::evict_if(const std::function<bool(const ChunkEntry&)>& pred) {
  std::vector<ChunkEntry*> victims;
  for (auto& [k, e] : index_)
    if (e->evictable() && (!pred || pred(*e))) victims.push_back(e.get());
  for (ChunkEntry* v : victims) erase(v);
  counters_.evicted_chunks += victims.size();
  return victims.size();
}

void ChunkStore::for_each(const std::function<bool(const ChunkEntry&)>& fn) const {
  for (const auto& [k, e] : index_)
    if (!fn(*e)) return;
}

}  // namespace kdn::sidecar
