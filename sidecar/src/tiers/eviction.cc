#include "tiers/eviction.h"

namespace kdn::sidecar {

void EntryList::push_front(Entry* e, uint8_t queue) {
  QueueLinks& l = links(e);
  l.queue = queue;
  l.prev = nullptr;
  l.next = head_;
  if (head_)
    links(head_).prev = e;
  else
    tail_ = e;
  head_ = e;
  ++size_;
}

void EntryList::remove(Entry* e) {
  QueueLinks& l = links(e);
  if (l.prev)
    links(l.prev).next = l.next;
  else
    head_ = l.next;
  if (l.next)
    links(l.next).prev = l.prev;
  else
    tail_ = l.prev;
  l.prev = l.next = nullptr;
  l.queue = 0;
  --size_;
}

Entry* EvictionPolicy::victim_any() {
  Entry* best = nullptr;
  for (uint16_t c = 0; c < class_count(); ++c) {
    Entry* v = victim(c);
    if (v && (!best || v->last_access_ns < best->last_access_ns)) best = v;
  }
  return best;
}

namespace {

// Classic LRU per size class.
class LruPolicy final : public EvictionPolicy {
 public:
  using EvictionPolicy::EvictionPolicy;
  void on_insert(Entry* e) override { list(cls_of(e)).push_front(e, 1); }
  void on_access(Entry* e) override {
    if (e->links[t()].queue == 0) return;
    EntryList& l = list(cls_of(e));
    l.remove(e);
    l.push_front(e, 1);
  }
  void on_remove(Entry* e) override {
    if (e->links[t()].queue) list(cls_of(e)).remove(e);
  }
  Entry* victim(uint16_t cls) override {
    if (cls >= lists_.size()) return nullptr;
    EntryList& l = lists_[cls];
    // Leased entries at the tail are in use: requeue them as recent (bounded by size()).
    for (uint64_t n = l.size(); n > 0; --n) {
      Entry* e = l.back();
      if (evictable(e)) return e;
      l.remove(e);
      l.push_front(e, 1);
    }
    return nullptr;
  }

 protected:
  uint16_t class_count() const override { return static_cast<uint16_t>(lists_.size()); }

 private:
  EntryList& list(uint16_t cls) {
    while (cls >= lists_.size()) lists_.emplace_back(t());
    return lists_[cls];
  }
  std::vector<EntryList> lists_;
};

// S3-FIFO (Yang et al., SOSP'23) per size class: a small probationary FIFO (10% of the
// class's entries), a main FIFO with 2-bit frequency and lazy promotion, and a ghost set
// of recently evicted keys that sends returning keys straight to main.
class S3FifoPolicy final : public EvictionPolicy {
 public:
  using EvictionPolicy::EvictionPolicy;
  void on_insert(Entry* e) override {
    Queues& q = queues(cls_of(e));
    e->links[t()].freq = 0;
    const uint64_t h = e->key.lo;
    if (q.ghost.erase(h))
      q.main.push_front(e, kMain);
    else
      q.small.push_front(e, kSmall);
  }
  void on_access(Entry* e) override {
    if (e->links[t()].freq < 3) ++e->links[t()].freq;
  }
  void on_remove(Entry* e) override {
    Queues& q = queues(cls_of(e));
    if (e->links[t()].queue == kSmall)
      q.small.remove(e);
    else if (e->links[t()].queue == kMain)
      q.main.remove(e);
  }
  // Evicted from small: it had no second access, and its return goes straight to main.
  void on_evict(Entry* e) override {
    if (e->links[t()].queue == kSmall) remember(queues(cls_of(e)), e->key.lo);
  }
  Entry* victim(uint16_t cls) override {
    if (cls >= queues_.size()) return nullptr;
    Queues& q = queues_[cls];
    // Each pass moves or returns one entry; 4x the population bounds the freq decrements.
    for (uint64_t n = 4 * (q.small.size() + q.main.size()) + 1; n > 0; --n) {
      const uint64_t total = q.small.size() + q.main.size();
      const bool from_small = q.small.size() > 0 && (q.small.size() * 10 >= total || q.main.size() == 0);
      EntryList& l = from_small ? q.small : q.main;
      Entry* e = l.back();
      if (!e) return nullptr;
      uint8_t& freq = e->links[t()].freq;
      if (!evictable(e) || freq > 0) {  // accessed since it was queued: keep it
        l.remove(e);
        if (from_small && evictable(e)) {
          freq = 0;
          q.main.push_front(e, kMain);
        } else {
          if (freq > 0) --freq;
          l.push_front(e, from_small ? kSmall : kMain);
        }
        continue;
      }
      return e;
    }
    return nullptr;
  }

 protected:
  uint16_t class_count() const override { return static_cast<uint16_t>(queues_.size()); }

 private:
  static constexpr uint8_t kSmall = 1, kMain = 2;
  struct Queues {
    explicit Queues(uint32_t tier) : small(tier), main(tier) {}
    EntryList small, main;
    std::unordered_set<uint64_t> ghost;
    std::deque<uint64_t> ghost_order;
  };
  void remember(Queues& q, uint64_t h) {
    if (!q.ghost.insert(h).second) return;
    q.ghost_order.push_back(h);
    const uint64_t cap = q.main.size() + q.small.size() + 16;
    while (q.ghost_order.size() > cap) {
      q.ghost.erase(q.ghost_order.front());
      q.ghost_order.pop_front();
    }
  }
  Queues& queues(uint16_t cls) {
    while (cls >= queues_.size()) queues_.emplace_back(t());
    return queues_[cls];
  }
  std::vector<Queues> queues_;
};

}  // namespace

bool parse_eviction_kind(std::string_view s, EvictionKind* out) {
  if (s == "lru") {
    *out = EvictionKind::kLru;
    return true;
  }
  if (s == "s3fifo" || s == "s3-fifo") {
    *out = EvictionKind::kS3Fifo;
    return true;
  }
  return false;
}

std::unique_ptr<EvictionPolicy> make_eviction_policy(EvictionKind kind, TierId tier) {
  if (kind == EvictionKind::kS3Fifo) return std::make_unique<S3FifoPolicy>(tier);
  return std::make_unique<LruPolicy>(tier);
}

}  // namespace kdn::sidecar
