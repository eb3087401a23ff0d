// ChunkStore: the chunk index of one namespace's host tier — keys to slots, the two-phase
// store, leases and eviction.
//
// State machine of a chunk:   (absent) --reserve--> kReserved --commit--> kCommitted
//                                            \--abort / writer dies--> (absent)
//   kCommitted --evict (only when leases == 0)--> (absent)
// A reserved chunk is invisible to lookups and leases; a second writer of the same key is told
// "in flight" and skips it. The store only manages offsets inside the arena; the memory itself
// (a memfd shared with the namespace's clients) belongs to the Namespace.
//
// Not thread-safe: the daemon's event loop owns every ChunkStore.
#pragma once

#include "chunk_entry.h"
#include "eviction.h"
#include "slab_allocator.h"

#include <kdn/common/model.h>
#include <kdn/kdn.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <unordered_map>

namespace kdn::sidecar {

struct ChunkStoreCounters {
  uint64_t lookups = 0, lookup_hit_chunks = 0, lookup_miss_chunks = 0;
  uint64_t stored_chunks = 0, stored_bytes = 0;
  uint64_t retrieved_chunks = 0, retrieved_bytes = 0;
  uint64_t evicted_chunks = 0, aborted_chunks = 0;
  uint64_t active_leases = 0, open_reservations = 0;
};

class ChunkStore {
 public:
  ChunkStore(uint64_t arena_bytes, uint64_t slab_bytes, EvictionKind eviction);

  // Number of leading keys whose chunks are committed with `bytes` bytes; counts accesses.
  uint32_t lookup(std::span<const kdn_key> keys, uint64_t bytes);

  enum class ReserveOutcome : uint8_t { kReserved = 1, kAlreadyCached = 2, kInFlight = 3 };
  struct Reservation {
    ReserveOutcome outcome;
    ChunkEntry* entry;  // set when kReserved
  };
  // Reserves a slot for `key`, evicting unleased chunks if needed. kNoSpace when every
  // candidate is leased or reserved; kInvalidArgument if `bytes` can never fit.
  Result<Reservation> reserve(const kdn_key& key, const kdn_key& fingerprint, uint64_t bytes,
                              uint64_t session, uint64_t now_ns);
  // Publishes a chunk reserved by `session`; kNotFound if it is not that session's.
  Status commit(ChunkEntry* e, uint64_t session, uint64_t now_ns);
  // Drops a reservation of `session` and frees its slot.
  Status abort(ChunkEntry* e, uint64_t session);

  // Pins a committed chunk of `bytes` bytes; null on a miss. Does not count as an access for
  // eviction: call touch() for that, in the order that suits prefix chains.
  ChunkEntry* lease(const kdn_key& key, uint64_t bytes, uint64_t now_ns);
  // Marks a chunk as used now for the eviction policy. A chain's chunks are touched from
  // last to first, so the head of a prefix is always the most recently used: eviction eats
  // documents from their tails, and what remains is still a usable prefix.
  void touch(ChunkEntry* e, uint64_t now_ns);
  void release(ChunkEntry* e);

  // Evicts one chunk if it is committed and unleased; false otherwise.
  bool evict(const kdn_key& key);
  // Evicts every unleased committed chunk that `pred` selects (all if pred is empty).
  uint64_t evict_if(const std::function<bool(const ChunkEntry&)>& pred);
  // Visits entries in unspecified order; stops when fn returns false.
  void for_each(const std::function<bool(const ChunkEntry&)>& fn) const;

  const ChunkStoreCounters& counters() const { return counters_; }
  uint64_t resident_chunks() const { return resident_chunks_; }
  uint64_t resident_bytes() const { return resident_bytes_; }
  uint64_t capacity_bytes() const { return alloc_.capacity(); }
  const ChunkEntry* find(const kdn_key& key) const;

 private:
  std::optional<uint64_t> alloc_slot(uint16_t cls);
  void erase(ChunkEntry* e);

  SlabAllocator alloc_;
  std::unique_ptr<EvictionPolicy> policy_;
  std::unordered_map<kdn_key, std::unique_ptr<ChunkEntry>, KeyHash> index_;
  ChunkStoreCounters counters_;
  uint64_t resident_chunks_ = 0, resident_bytes_ = 0;
};

}  // namespace kdn::sidecar
