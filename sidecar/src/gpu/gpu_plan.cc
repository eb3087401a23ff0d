#include "gpu_plan.h"

#include <algorithm>

namespace kdn::sidecar::gpu {

Route route(const RouteInput& in) noexcept {
  if (in.t0_device == in.engine_device) return Route::kT0Local;
  if (in.t0_device >= 0 && in.peer_ok) return Route::kT0Peer;
  return in.t0_room ? Route::kHostToT0 : Route::kHostToStage;
}

const char* route_name(Route r) noexcept {
  switch (r) {
    case Route::kT0Local:
      return "t0";
    case Route::kT0Peer:
      return "t0_peer";
    case Route::kHostToT0:
      return "host_to_t0";
    case Route::kHostToStage:
      return "host_to_staging";
  }
  return "unknown";
}

std::vector<Copy> slice_copies(std::span<const Copy> copies, uint64_t slice_bytes) {
  std::vector<Copy> out;
  for (const Copy& c : copies) {
    if (slice_bytes == 0 || c.bytes <= slice_bytes) {
      out.push_back(c);
      continue;
    }
    for (uint64_t done = 0; done < c.bytes; done += slice_bytes)
      out.push_back(Copy{c.dst + done, c.src + done, std::min(slice_bytes, c.bytes - done)});
  }
  return out;
}

std::optional<uint64_t> FifoRing::alloc(uint64_t n) noexcept {
  n = (n + align_ - 1) / align_ * align_;
  if (n == 0 || n > bytes_) return std::nullopt;
  uint64_t at = head_, charge = n;
  if (at + n > bytes_) {  // does not fit before the end: skip the tail, start at 0
    charge += bytes_ - at;
    at = 0;
  }
  if (used_ + charge > bytes_) return std::nullopt;
  // The oldest allocation still held starts at tail = head_ - used_ (mod bytes): room is what
  // lies between head and tail, which used_ already accounts for.
  try {
    if (first_ > 64 && first_ * 2 > held_.size()) {
      held_.erase(held_.begin(), held_.begin() + std::ptrdiff_t(first_));
      first_ = 0;
    }
    held_.push_back(Held{head_, at + n, charge});
  } catch (...) {
    return std::nullopt;
  }
  used_ += charge;
  head_ = at + n == bytes_ ? 0 : at + n;
  return at;
}

void FifoRing::undo_newest() noexcept {
  if (first_ >= held_.size()) return;
  used_ -= held_.back().charge;
  head_ = held_.back().start;
  held_.pop_back();
  if (first_ == held_.size()) {
    held_.clear();
    first_ = 0;
  }
  if (used_ == 0) head_ = 0;
}

void FifoRing::release_oldest() noexcept {
  if (first_ >= held_.size()) return;
  used_ -= held_[first_].charge;
  ++first_;
  if (first_ == held_.size()) {
    held_.clear();
    first_ = 0;
  }
  if (used_ == 0) head_ = 0;
}

}  // namespace kdn::sidecar::gpu
