#include "payload_allocator.h"

namespace kdn::shim {

std::optional<PayloadRange> PayloadAllocator::alloc(uint32_t bytes) {
  if (bytes == 0) return PayloadRange{0, 0};
  const uint64_t want = (uint64_t(bytes) + kAlign - 1) / kAlign * kAlign;
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < want) continue;
    PayloadRange r{it->first, uint32_t(want)};
    const uint32_t rest = it->second - uint32_t(want);
    const uint32_t rest_off = it->first + uint32_t(want);
    free_.erase(it);
    if (rest) free_[rest_off] = rest;
    return r;
  }
  return std::nullopt;
}

void PayloadAllocator::free(PayloadRange r) {
  if (r.len == 0) return;
  auto [it, inserted] = free_.emplace(r.off, r.len);
  if (!inserted) return;  // double free: ignore rather than corrupt the map
  auto next = std::next(it);
  if (next != free_.end() && it->first + it->second == next->first) {
    it->second += next->second;
    free_.erase(next);
  }
  if (it != free_.begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second == it->first) {
      prev->second += it->second;
      free_.erase(it);
    }
  }
}

}  // namespace kdn::shim
