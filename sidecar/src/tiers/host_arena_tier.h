// HostArenaTier: T1, one namespace's host arena — a memfd that every session of the namespace
// maps read-only, cut into slots by a SlabAllocator.
//
// The arena is created by kdnd, mapped read-write here, then sealed with F_SEAL_FUTURE_WRITE
// (ipc/segment.h): from then on only this mapping can change its bytes. Clients write stores
// into their own staging areas, and a transfer of this tier copies them into place.
//
// Transfers are copies between host memory and arena slots. A copy of at most
// `inline_bytes` runs at once on the calling (event loop) thread; a larger one runs on a
// oneTBB worker arena of `copy_threads` threads with streaming stores, so a 32 MiB chunk
// never holds up the loop. Either way the completion is handed back through wake_fd()/reap().
//
// Thread safety: the Tier methods are called from the event loop thread only; the workers
// touch nothing but the bytes of the transfers they run and the completion queue.
#pragma once

#include "tiers/slab_allocator.h"
#include "tier.h"

#include <kdn/ipc/fd.h>
#include <kdn/ipc/segment.h>

#include <functional>
#include <memory>
#include <vector>

namespace kdn::sidecar {

struct HostArenaOptions {
  uint64_t slab_bytes = 64ull << 20;
  uint32_t copy_threads = 2;
  uint64_t inline_bytes = 256ull << 10;  // copies up to this size run on the loop thread
};

class HostArenaTier final : public Tier {
 public:
  // Takes a segment created with seal_writes (its mapping is the only writable one).
  static Result<std::unique_ptr<HostArenaTier>> create(ipc::SharedSegment arena,
                                                       const HostArenaOptions& options) noexcept;
  ~HostArenaTier() override;  // waits for the copies in flight

  TierId id() const noexcept override { return TierId::kHost; }
  TierCapabilities capabilities() const noexcept override { return {true, true, false}; }
  uint64_t capacity_bytes() const noexcept override { return alloc_.capacity(); }
  uint64_t used_bytes() const noexcept override { return alloc_.used_bytes(); }
  Result<uint16_t> slot_class(uint64_t bytes) noexcept override;
  Result<Placement> allocate(uint64_t bytes) noexcept override;
  void free(const Placement& placement) noexcept override;
  std::byte* address(const Placement& placement) const noexcept override { return arena_.data() + placement.offset; }
  Status submit(const Transfer& t) noexcept override;
  int wake_fd() const noexcept override { return wake_.get(); }
  size_t reap(std::span<TierCompletion> out) noexcept override;
  uint64_t in_flight() const noexcept override { return submitted_ - reaped_; }

  const ipc::SharedSegment& arena() const noexcept { return arena_; }
  // Runs `task` on a copy worker, after the copies queued before it; no completion. The task
  // must keep alive whatever it touches.
  Status run_task(std::function<void()> task) noexcept;

 private:
  struct Workers;
  HostArenaTier(ipc::SharedSegment arena, const HostArenaOptions& options, ipc::UniqueFd wake);

  ipc::SharedSegment arena_;
  SlabAllocator alloc_;
  HostArenaOptions options_;
  ipc::UniqueFd wake_;  // eventfd: worker completions wait
  std::unique_ptr<Workers> workers_;
  std::vector<TierCompletion> inline_done_;  // loop thread only
  uint64_t submitted_ = 0, reaped_ = 0;      // loop thread only
};

}  // namespace kdn::sidecar
