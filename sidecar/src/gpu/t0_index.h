// T0Index: which chunks have a copy in one device's T0 region, and where.
//
// Slots come from a SlabAllocator over the region (chunks of several models share it by size
// class). A key is (namespace region, chunk key, the chunk's entry generation): a chunk
// evicted from every tier and stored again is a new entry with a new generation, so a stale T0
// copy is never served; it ages out of the LRU like any cold slot.
//
// Demotion policy: T0 is inclusive of T1. Every T0 copy was made from a T1 copy (promotion at
// GPU_RETRIEVE) or written to one (GPU_STORE gathers into T0 and copies that to the host
// arena), so evicting from T0 drops the copy and loses nothing; nothing is ever written down
// from T0.
//
// A slot read by copies in flight is pinned (pin/unpin) and never evicted or reused meanwhile.
// Pure C++; not thread-safe (the event loop owns it).
#pragma once

#include "tiers/slab_allocator.h"

#include <kdn/kdn.h>

#include <cstdint>
#include <functional>
#include <list>
#include <optional>
#include <unordered_map>

namespace kdn::sidecar::gpu {

struct T0Key {
  uint32_t region = 0;  // the namespace's arena region id
  kdn_key key{};
  uint64_t generation = 0;
  bool operator==(const T0Key& o) const noexcept {
    return region == o.region && key.lo == o.key.lo && key.hi == o.key.hi && generation == o.generation;
  }
};
struct T0KeyHash {
  size_t operator()(const T0Key& k) const noexcept {
    return size_t(k.key.lo ^ (k.key.hi * 0x9E3779B97F4A7C15ull) ^ (k.generation << 1) ^ k.region);
  }
};

struct T0Counters {
  uint64_t hits = 0, misses = 0, promoted = 0, stored = 0, evicted = 0, promoted_bytes = 0;
};

class T0Index {
 public:
  T0Index(uint64_t capacity_bytes, uint64_t slab_bytes);

  // The slot offset of `k` (marked most recently used), or nullopt.
  std::optional<uint64_t> find(const T0Key& k) noexcept;
  // Whether `k` has a findable slot (no recency change, no counters).
  bool contains(const T0Key& k) const noexcept {
    auto it = slots_.find(k);
    return it != slots_.end() && it->second.published;
  }
  // A slot for `k` of `bytes` (evicting unpinned least recently used slots as needed), or nullopt
  // if every slot is pinned, the size can never fit, or `k` has a slot already. The slot is not
  // findable until publish(): the copy into it is still in flight.
  std::optional<uint64_t> insert(const T0Key& k, uint64_t bytes);
  // The copy into `k`'s slot was queued (stream order makes readers wait for it): findable now.
  void publish(const T0Key& k) noexcept;
  void pin(const T0Key& k) noexcept;
  void unpin(const T0Key& k) noexcept;
  // Drops `k` (unpinned only); false if absent or pinned.
  bool erase(const T0Key& k) noexcept;
  // Called with every key whose slot goes (erase, and eviction inside insert), after it went:
  // whoever keeps something beside a slot (the host copy of a blob) drops it there.
  void on_erase(std::function<void(const T0Key&)> fn) { on_erase_ = std::move(fn); }

  uint64_t capacity() const noexcept { return slabs_.capacity(); }
  uint64_t used() const noexcept { return slabs_.used_bytes(); }
  uint64_t resident_chunks() const noexcept { return published_; }
  uint64_t resident_bytes() const noexcept { return resident_bytes_; }
  T0Counters& counters() noexcept { return counters_; }
  const T0Counters& counters() const noexcept { return counters_; }

 private:
  struct Slot {
    uint64_t offset = 0, bytes = 0;
    uint16_t cls = 0;
    uint32_t pins = 0;
    bool published = false;
    std::list<T0Key>::iterator lru;  // front: most recent
  };
  bool evict_one() noexcept;

  SlabAllocator slabs_;
  std::unordered_map<T0Key, Slot, T0KeyHash> slots_;
  std::list<T0Key> lru_;
  uint64_t published_ = 0, resident_bytes_ = 0;
  T0Counters counters_;
  std::function<void(const T0Key&)> on_erase_;
};

}  // namespace kdn::sidecar::gpu
