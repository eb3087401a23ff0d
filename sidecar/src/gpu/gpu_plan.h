// Pure decisions of the GPU data path, unit-tested on the CPU: where a chunk is read from
// (routing), how bulk copies are cut (slicing), and the FIFO ring that hands out per-request
// pinned metadata and bounce space released in completion order.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace kdn::sidecar::gpu {

// ---- routing ------------------------------------------------------------------------------------
// How one chunk reaches an engine on device `engine_device`:
//   kT0Local     its T0 copy is on the engine's device: scatter from it (device to device)
//   kT0Peer      its T0 copy is on another device the engine's device can read (peer access,
//                enabled once): the scatter kernel on the engine's device reads it over NVLink/PCIe
//   kHostToT0    through T1: H2D into a fresh T0 slot on the engine's device (a promotion), then
//                scatter from there — also when the T0 copy is on a device without peer access
//   kHostToStage through T1 into the device's bounce buffer (T0 off, or full of pinned slots)
enum class Route : uint8_t { kT0Local, kT0Peer, kHostToT0, kHostToStage };
struct RouteInput {
  int t0_device = -1;  // device holding a T0 copy, -1: none
  int engine_device = 0;
  bool peer_ok = false;  // can_access_peer(engine_device, t0_device)
  bool t0_room = false;  // a T0 slot can be had on the engine's device
};
Route route(const RouteInput& in) noexcept;
const char* route_name(Route r) noexcept;

// ---- slicing ------------------------------------------------------------------------------------
// A copy between two addresses (any of host, device, peer device).
struct Copy {
  uint64_t dst = 0, src = 0, bytes = 0;
};
// Cuts copies into pieces of at most slice_bytes (slice_bytes 0: unchanged), in order; the pieces
// of one copy are contiguous and cover it exactly. Between two slices on a low-priority stream
// the GPU schedules the engine's higher-priority kernels.
std::vector<Copy> slice_copies(std::span<const Copy> copies, uint64_t slice_bytes);

// ---- FIFO ring ----------------------------------------------------------------------------------
// Hands out byte ranges of a fixed area to requests whose GPU work completes in the order it
// was queued (one stream per device), and takes them back in that order. Ranges are aligned to
// `align` and never wrap.
class FifoRing {
 public:
  FifoRing(uint64_t bytes, uint64_t align) noexcept : bytes_(bytes), align_(align) {}
  // The offset of `n` free bytes, or nullopt if the ring has no room now.
  std::optional<uint64_t> alloc(uint64_t n) noexcept;
  // Releases the oldest allocation still held (the one `alloc` handed out first).
  void release_oldest() noexcept;
  // Takes back the newest allocation (its work was never queued).
  void undo_newest() noexcept;
  uint64_t used() const noexcept { return used_; }
  uint64_t capacity() const noexcept { return bytes_; }
  size_t held() const noexcept { return held_.size() - first_; }

 private:
  struct Held {
    uint64_t start;   // head before this allocation
    uint64_t end;     // head after this allocation
    uint64_t charge;  // bytes it holds (padding to the wrap included)
  };
  uint64_t bytes_, align_;
  uint64_t head_ = 0, used_ = 0;
  std::vector<Held> held_;  // oldest first
  size_t first_ = 0;
};

}  // namespace kdn::sidecar::gpu
