#include "staging.h"

namespace kdn::sidecar {

Result<StagingArea> StagingArea::create(uint64_t bytes) noexcept {
  if (bytes == 0 || bytes % kAlign != 0) return Status(Code::kInvalidArgument, "staging size must be a 4 KiB multiple");
  ipc::SegmentOptions options;
  options.madvise_huge = true;  // fewer page faults per chunk, where the kernel gives shmem huge pages
  auto seg = ipc::SharedSegment::create("kdn-staging", bytes, options);
  if (!seg.ok()) return seg.status();
  StagingArea s;
  try {
    s.segment_ = std::make_shared<ipc::SharedSegment>(std::move(*seg));
    s.free_.emplace(0, s.segment_->size());
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoMemory, "staging bookkeeping");
  }
  s.free_bytes_ = s.segment_->size();
  return s;
}

std::shared_ptr<void> StagingArea::take_memory() noexcept {
  free_.clear();
  live_.clear();
  free_bytes_ = 0;
  return std::move(segment_);
}

std::optional<uint64_t> StagingArea::allocate(uint64_t bytes) {
  const uint64_t need = round(bytes);
  if (need == 0 || need > free_bytes_) return std::nullopt;
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < need) continue;
    const uint64_t off = it->first, len = it->second;
    if (len == need) {
      live_.insert(free_.extract(it));  // the free node becomes the slot's: no allocation
    } else {
      live_.emplace(off, need);  // the one allocation, before anything changes
      auto rest = free_.extract(it);
      rest.key() = off + need;
      rest.mapped() = len - need;
      free_.insert(std::move(rest));
    }
    free_bytes_ -= need;
    return off;
  }
  return std::nullopt;
}

uint64_t StagingArea::slot_bytes(uint64_t offset) const noexcept {
  auto it = live_.find(offset);
  return it == live_.end() ? 0 : it->second;
}

void StagingArea::free(uint64_t offset) noexcept {
  auto node = live_.extract(offset);
  if (!node) return;
  uint64_t len = node.mapped();
  free_bytes_ += len;
  auto next = free_.lower_bound(offset);
  if (next != free_.end() && offset + len == next->first) {  // merge with the range after
    len += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {  // merge with the range before
      prev->second += len;
      return;
    }
  }
  node.key() = offset;
  node.mapped() = len;
  free_.insert(std::move(node));
}

}  // namespace kdn::sidecar
