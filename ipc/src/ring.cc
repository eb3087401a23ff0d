#include <kdn/ipc/ring.h>

#include <bit>

namespace kdn::ipc::ring_detail {

Status check_region(const void* region, uint64_t region_bytes, uint32_t capacity, size_t entry_size,
                    size_t entry_align) noexcept {
  if (region == nullptr) return Status(Code::kInvalidArgument, "ring region is null");
  if (reinterpret_cast<uintptr_t>(region) % 64 != 0 || 64 % entry_align != 0) {
    return Status(Code::kInvalidArgument, "ring region is not 64-byte aligned");
  }
  if (!std::has_single_bit(capacity) || capacity > kMaxRingCapacity) {
    return Status(Code::kInvalidArgument, "ring capacity is not a power of two in range");
  }
  if (region_bytes < ring_region_bytes(capacity, entry_size)) {
    return Status(Code::kInvalidArgument, "ring region too small for its capacity");
  }
  return OkStatus();
}

}  // namespace kdn::ipc::ring_detail
