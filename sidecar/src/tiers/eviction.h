// Eviction policies: which copy in one tier to drop (or demote) when that tier needs room.
//
// Each tier has its own policy instance. A policy keeps intrusive queues through
// Entry::links[tier], one set per size class of that tier (Placement::slot_class), since
// freeing a slot only helps allocations of the same class. It never picks a copy that is not
// evictable_from(tier) (leased host copies, copies under a transfer, reservations): such
// entries are skipped and re-queued as recently used, which keeps later scans short.
// Not thread-safe: owned by the daemon's event loop.
#pragma once

#include "chunk_index.h"

#include <cstdint>
#include <deque>
#include <memory>
#include <string_view>
#include <unordered_set>
#include <vector>

namespace kdn::sidecar {

// A doubly-linked intrusive list through one tier's links: push_front = newest, back = oldest.
class EntryList {
 public:
  explicit EntryList(uint32_t tier = 0) : tier_(tier) {}
  void push_front(Entry* e, uint8_t queue);
  void remove(Entry* e);
  Entry* back() const { return tail_; }
  uint64_t size() const { return size_; }

 private:
  QueueLinks& links(Entry* e) const { return e->links[tier_]; }
  uint32_t tier_;
  Entry* head_ = nullptr;
  Entry* tail_ = nullptr;
  uint64_t size_ = 0;
};

class EvictionPolicy {
 public:
  explicit EvictionPolicy(TierId tier) : tier_(tier) {}
  virtual ~EvictionPolicy() = default;
  virtual void on_insert(Entry* e) = 0;  // a copy arrived in this tier
  virtual void on_access(Entry* e) = 0;  // leased or looked up
  virtual void on_remove(Entry* e) = 0;  // the copy leaves this tier, for any reason
  // The store evicts `e`, a victim this policy returned (on_remove follows when its copy
  // leaves). Policies that remember evicted keys do it here, not when a victim is merely
  // proposed: victim_any() asks every class and evicts one.
  virtual void on_evict(Entry* e) { (void)e; }
  // An entry whose copy of class `cls` may leave this tier, or null if none. Does not
  // remove it.
  virtual Entry* victim(uint16_t cls) = 0;
  // The same for any class, preferring the least recently used class tail.
  Entry* victim_any();
  TierId tier() const { return tier_; }

 protected:
  virtual uint16_t class_count() const = 0;
  uint32_t t() const { return tier_index(tier_); }
  uint16_t cls_of(const Entry* e) const { return e->placement[t()].slot_class; }
  bool evictable(const Entry* e) const { return e->evictable_from(tier_); }

 private:
  TierId tier_;
};

enum class EvictionKind { kLru, kS3Fifo };
bool parse_eviction_kind(std::string_view s, EvictionKind* out);
std::unique_ptr<EvictionPolicy> make_eviction_policy(EvictionKind kind, TierId tier);

}  // namespace kdn::sidecar
