// ChunkEntry: the daemon's record of one chunk in one namespace.
#pragma once

#include <kdn/kdn.h>

#include <cstdint>

namespace kdn::sidecar {

enum class ChunkState : uint8_t {
  kReserved = 1,   // a slot is allocated and one session is writing it; invisible to lookups
  kCommitted = 2,  // readable by every session of the namespace
};

struct ChunkEntry {
  kdn_key key{};
  kdn_key fingerprint{};     // model identity, for listing and admin eviction
  uint64_t arena_off = 0;
  uint64_t bytes = 0;
  uint64_t last_access_ns = 0;
  uint64_t owner_session = 0;  // the writer while kReserved
  uint32_t leases = 0;         // live leases; > 0 pins the chunk (never evicted or moved)
  uint16_t size_class = 0;
  uint8_t tier = 1;            // 1 = host arena
  ChunkState state = ChunkState::kReserved;

  // Eviction-queue bookkeeping, owned by the EvictionPolicy.
  ChunkEntry* q_prev = nullptr;
  ChunkEntry* q_next = nullptr;
  uint8_t q_id = 0;
  uint8_t freq = 0;

  bool evictable() const { return state == ChunkState::kCommitted && leases == 0; }
};

}  // namespace kdn::sidecar
