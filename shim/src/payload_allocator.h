// PayloadAllocator: first-fit ranges in the client's payload area, so several requests
// can be in flight at once with disjoint inputs and outputs.
#pragma once

#include <cstdint>
#include <map>
#include <optional>

namespace kdn::shim {

struct PayloadRange {
  uint32_t off = 0;
  uint32_t len = 0;
};

class PayloadAllocator {
 public:
  static constexpr uint32_t kAlign = 64;
  explicit PayloadAllocator(uint32_t bytes = 0) { reset(bytes); }
  void reset(uint32_t bytes) {
    free_.clear();
    if (bytes) free_[0] = bytes;
  }
  // A range of at least `bytes` (a zero-byte request gets an empty range at offset 0).
  std::optional<PayloadRange> alloc(uint32_t bytes);
  void free(PayloadRange r);

 private:
  std::map<uint32_t, uint32_t> free_;  // offset -> length, coalesced
};

}  // namespace kdn::shim
