#include "t0_index.h"

namespace kdn::sidecar::gpu {

T0Index::T0Index(uint64_t capacity_bytes, uint64_t slab_bytes) : slabs_(capacity_bytes, slab_bytes) {}

std::optional<uint64_t> T0Index::find(const T0Key& k) noexcept {
  auto it = slots_.find(k);
  if (it == slots_.end() || !it->second.published) {
    ++counters_.misses;
    return std::nullopt;
  }
  lru_.splice(lru_.begin(), lru_, it->second.lru);
  ++counters_.hits;
  return it->second.offset;
}

bool T0Index::evict_one() noexcept {
  for (auto it = lru_.rbegin(); it != lru_.rend(); ++it) {
    auto s = slots_.find(*it);
    if (s->second.pins == 0 && s->second.published) {
      ++counters_.evicted;
      return erase(T0Key(*it));
    }
  }
  return false;
}

std::optional<uint64_t> T0Index::insert(const T0Key& k, uint64_t bytes) {
  if (slots_.count(k)) return std::nullopt;  // a copy into it is in flight (or it is there)
  auto cls = slabs_.class_for(bytes);
  if (!cls) return std::nullopt;
  std::optional<uint64_t> off = slabs_.alloc(*cls);
  while (!off && evict_one()) off = slabs_.alloc(*cls);
  if (!off) return std::nullopt;
  try {
    lru_.push_front(k);
    Slot s;
    s.offset = *off;
    s.bytes = bytes;
    s.cls = *cls;
    s.lru = lru_.begin();
    slots_.emplace(k, s);
  } catch (...) {
    if (!lru_.empty() && lru_.front() == k) lru_.pop_front();
    slabs_.free(*cls, *off);
    throw;
  }
  return off;
}

void T0Index::publish(const T0Key& k) noexcept {
  auto it = slots_.find(k);
  if (it == slots_.end() || it->second.published) return;
  it->second.published = true;
  ++published_;
  resident_bytes_ += it->second.bytes;
}

void T0Index::pin(const T0Key& k) noexcept {
  if (auto it = slots_.find(k); it != slots_.end()) ++it->second.pins;
}

void T0Index::unpin(const T0Key& k) noexcept {
  if (auto it = slots_.find(k); it != slots_.end() && it->second.pins > 0) --it->second.pins;
}

bool T0Index::erase(const T0Key& k) noexcept {
  auto it = slots_.find(k);
  if (it == slots_.end() || it->second.pins > 0) return false;
  if (it->second.published) {
    --published_;
    resident_bytes_ -= it->second.bytes;
  }
  slabs_.free(it->second.cls, it->second.offset);
  lru_.erase(it->second.lru);
  const T0Key gone = it->first;
  slots_.erase(it);
  if (on_erase_) on_erase_(gone);
  return true;
}

}  // namespace kdn::sidecar::gpu
