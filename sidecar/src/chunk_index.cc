#include "chunk_index.h"

#include <cassert>

namespace kdn::sidecar {

namespace {
constexpr uint8_t bit(TierId t) { return uint8_t(1u << tier_index(t)); }
}  // namespace

const char* tier_name(TierId t) noexcept {
  switch (t) {
    case TierId::kGpu:
      return "gpu";
    case TierId::kHost:
      return "host";
    case TierId::kDisk:
      return "disk";
    case TierId::kRemote:
      return "remote";
  }
  return "unknown";
}

uint32_t Entry::fastest_tier() const noexcept {
  for (uint32_t t = 0; t < kTierCount; ++t)
    if ((resident >> t) & 1u) return t;
  return kTierCount;
}

bool Entry::evictable_from(TierId t) const noexcept {
  if (!committed() || !in_tier(t) || io != 0 || (evicting & bit(t))) return false;
  return t != TierId::kHost || leases == 0;
}

Entry* ChunkIndex::find(const kdn_key& key) noexcept {
  auto it = map_.find(key);
  return it == map_.end() ? nullptr : it->second.get();
}

const Entry* ChunkIndex::find(const kdn_key& key) const noexcept {
  auto it = map_.find(key);
  return it == map_.end() ? nullptr : it->second.get();
}

Entry* ChunkIndex::create(const kdn_key& key, const kdn_key& fingerprint, uint64_t bytes, uint64_t owner,
                          uint64_t now_ns) {
  assert(find(key) == nullptr);
  auto e = std::make_unique<Entry>();
  e->key = key;
  e->fingerprint = fingerprint;
  e->bytes = bytes;
  e->generation = next_generation_++;
  e->owner_session = owner;
  e->last_access_ns = now_ns;
  e->created_ns = now_ns;
  e->state = EntryState::kReserved;
  Entry* raw = e.get();
  map_.emplace(key, std::move(e));
  ++counters_.created;
  return raw;
}

void ChunkIndex::begin_write(Entry* e) noexcept {
  assert(e->state == EntryState::kReserved);
  e->state = EntryState::kWriting;
}

void ChunkIndex::publish(Entry* e, uint64_t now_ns) noexcept {
  assert(e->state == EntryState::kWriting);
  e->state = EntryState::kCommitted;
  e->owner_session = 0;
  e->last_access_ns = now_ns;
  ++counters_.published;
}

void ChunkIndex::add_copy(Entry* e, TierId t, const Placement& p) noexcept {
  assert(!e->in_tier(t));
  e->placement[tier_index(t)] = p;
  e->resident |= bit(t);
}

Placement ChunkIndex::drop_copy(Entry* e, TierId t) noexcept {
  assert(e->in_tier(t) || e->placement[tier_index(t)].valid());
  const Placement p = e->placement[tier_index(t)];
  e->placement[tier_index(t)] = Placement{};
  e->resident &= uint8_t(~bit(t));
  e->evicting &= uint8_t(~bit(t));
  return p;
}

void ChunkIndex::begin_move(Entry* e, TierId t, const Placement& p) noexcept {
  assert(!e->in_tier(t) && !e->moving_to(t));
  e->placement[tier_index(t)] = p;
  e->moving |= bit(t);
}

Placement ChunkIndex::end_move(Entry* e, TierId t, bool ok) noexcept {
  assert(e->moving_to(t));
  e->moving &= uint8_t(~bit(t));
  if (ok) {
    e->resident |= bit(t);
    return Placement{};
  }
  const Placement p = e->placement[tier_index(t)];
  e->placement[tier_index(t)] = Placement{};
  return p;
}

void ChunkIndex::erase(Entry* e) noexcept {
  assert(e->resident == 0 && e->moving == 0 && e->leases == 0 && e->io == 0);
  assert(!e->placement[0].valid() && !e->placement[1].valid() && !e->placement[2].valid() && !e->placement[3].valid());
  const kdn_key key = e->key;  // erase by a copy: the entry owns the original
  map_.erase(key);             // destroys *e
  ++counters_.erased;
}

void ChunkIndex::for_each(const std::function<bool(Entry&)>& fn) {
  for (auto& [k, e] : map_)
    if (!fn(*e)) return;
}

}  // namespace kdn::sidecar
