// ChunkIndex: one namespace's chunks — key to entry, and each entry's state, pins and copies.
// It is tier-agnostic and owns no chunk memory: a copy is a Placement in some Tier, and the
// TieredStore (tiered_store.h) allocates, moves and frees them.
//
// State machine of an entry:
//
//   (absent) --create--> kReserved --begin_write--> kWriting --publish--> kCommitted
//                            |                          |
//                            +-- abort / writer dies    +-- the copy failed
//                                --> (absent)               --> (absent)
//
//   kCommitted: readable. Copies come and go per tier (add_copy / drop_copy), and moves are
//   in flight while `moving` has bits: a chunk being demoted stays readable in its source tier
//   until the write completes; a chunk being promoted is read once the copy lands. The entry
//   leaves the index (erase) when its last copy is dropped.
//
// Pins: `leases` (sessions holding a lease; each pins the host copy: never evicted or moved
// out) and `io` (transfers in flight that touch any of its placements: nothing under a
// transfer is freed). An entry is erased only with no pins. `generation` grows each time a
// key is created anew, so a completion that names an older incarnation is recognised.
//
// Not thread-safe: the daemon's event loop owns every index.
#pragma once

#include "tier.h"

#include <kdn/common/model.h>
#include <kdn/kdn.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <unordered_map>

namespace kdn::sidecar {

enum class EntryState : uint8_t {
  kReserved = 1,   // a writer holds the reservation; the host placement waits for its bytes
  kWriting = 2,    // the writer committed: its staging bytes are being copied into place
  kCommitted = 3,  // readable in every tier `resident` names
};

// Eviction-queue membership in one tier, owned by that tier's EvictionPolicy.
struct QueueLinks {
  struct Entry* prev = nullptr;
  struct Entry* next = nullptr;
  uint8_t queue = 0;  // 0 = in no queue
  uint8_t freq = 0;
};

struct Entry {
  kdn_key key{};
  kdn_key fingerprint{};  // the model's (listing, admin eviction)
  uint64_t bytes = 0;     // canonical chunk bytes
  uint64_t generation = 0;
  uint64_t owner_session = 0;  // the writer while kReserved or kWriting
  uint64_t last_access_ns = 0;
  uint64_t created_ns = 0;  // reserved (or adopted at start); kdnctl ls shows the age
  kdn_key chain_head{};     // the first key of the prefix chain it was stored in (LIST)
  uint32_t chain_pos = 0;   // its position there plus one; 0: not known (segments, old clients)
  uint32_t leases = 0;      // sessions leasing it; > 0 pins the host copy
  uint32_t io = 0;          // transfers in flight touching its placements
  EntryState state = EntryState::kReserved;
  uint8_t resident = 0;  // bit t: a valid copy in tier t
  uint8_t moving = 0;    // bit t: a copy into tier t is in flight
  uint8_t evicting = 0;  // bit t: that copy leaves tier t once a move out completes
  Placement placement[kTierCount];
  QueueLinks links[kTierCount];

  bool committed() const noexcept { return state == EntryState::kCommitted; }
  bool in_tier(TierId t) const noexcept { return (resident >> tier_index(t)) & 1u; }
  bool moving_to(TierId t) const noexcept { return (moving >> tier_index(t)) & 1u; }
  // The fastest tier holding a copy (lowest id), or kTierCount if none.
  uint32_t fastest_tier() const noexcept;
  // Whether the copy in tier t may be dropped now: committed, present, not pinned by a
  // transfer, not already leaving, and (for the host copy) not leased.
  bool evictable_from(TierId t) const noexcept;
};

struct IndexCounters {
  uint64_t created = 0, published = 0, aborted = 0, erased = 0;
};

class ChunkIndex {
 public:
  // The entry of `key` in any state, or null.
  Entry* find(const kdn_key& key) noexcept;
  const Entry* find(const kdn_key& key) const noexcept;

  // absent -> kReserved for `owner`. The key must be absent.
  Entry* create(const kdn_key& key, const kdn_key& fingerprint, uint64_t bytes, uint64_t owner, uint64_t now_ns);
  // kReserved -> kWriting (the owner committed).
  void begin_write(Entry* e) noexcept;
  // kWriting -> kCommitted; the writer is forgotten.
  void publish(Entry* e, uint64_t now_ns) noexcept;

  // Records a valid copy in tier t (the placement must be the entry's placement[t]).
  void add_copy(Entry* e, TierId t, const Placement& p) noexcept;
  // Forgets the copy in tier t and returns its placement (for the tier to free).
  Placement drop_copy(Entry* e, TierId t) noexcept;
  // A transfer into tier t is starting / has ended (ok: the copy is valid now).
  void begin_move(Entry* e, TierId t, const Placement& p) noexcept;
  Placement end_move(Entry* e, TierId t, bool ok) noexcept;

  // Removes the entry; it must hold no copy, no placement, no pin and no transfer.
  void erase(Entry* e) noexcept;

  uint64_t size() const noexcept { return map_.size(); }
  const IndexCounters& counters() const noexcept { return counters_; }
  // Visits entries in unspecified order; stops when fn returns false.
  void for_each(const std::function<bool(Entry&)>& fn);

 private:
  std::unordered_map<kdn_key, std::unique_ptr<Entry>, KeyHash> map_;
  uint64_t next_generation_ = 1;
  IndexCounters counters_;
};

}  // namespace kdn::sidecar
