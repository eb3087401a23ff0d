// Eviction policies: which committed, unleased chunk to drop when a slot is needed.
//
// Policies keep their own intrusive queues (ChunkEntry::q_*), one set per size class, since
// freeing a slot only helps allocations of the same class. They never evict a leased or
// reserved chunk: such entries are skipped (and re-queued as recently used, which keeps later
// scans short). Not thread-safe: owned by the daemon's event loop.
#pragma once

#include "chunk_entry.h"

#include <cstdint>
#include <deque>
#include <memory>
#include <string_view>
#include <unordered_set>
#include <vector>

namespace kdn::sidecar {

// A doubly-linked intrusive FIFO/LRU list: push_front = newest, back = oldest.
class EntryList {
 public:
  void push_front(ChunkEntry* e, uint8_t id);
  void remove(ChunkEntry* e);
  ChunkEntry* back() const { return tail_; }
  uint64_t size() const { return size_; }

 private:
  ChunkEntry* head_ = nullptr;
  ChunkEntry* tail_ = nullptr;
  uint64_t size_ = 0;
};

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;
  virtual void on_insert(ChunkEntry* e) = 0;   // newly committed
  virtual void on_access(ChunkEntry* e) = 0;   // leased or looked up
  virtual void on_remove(ChunkEntry* e) = 0;   // leaving the index for any reason
  // An evictable entry of class `cls`, or null if none. Does not remove it.
  virtual ChunkEntry* victim(uint16_t cls) = 0;
  // An evictable entry of any class, preferring the least recently used class tail.
  ChunkEntry* victim_any();

 protected:
  virtual uint16_t class_count() const = 0;
};

enum class EvictionKind { kLru, kS3Fifo };
bool parse_eviction_kind(std::string_view s, EvictionKind* out);
std::unique_ptr<EvictionPolicy> make_eviction_policy(EvictionKind kind);

}  // namespace kdn::sidecar
