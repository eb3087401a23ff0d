// FaultTier: an in-memory tier for tests that fails on command. It stands in for a lower
// tier (disk, remote) under the TieredStore, so the index's moves, the request handler's
// pending operations and a session dying with transfers in flight are tested on every
// machine, with the faults a real device has: a transfer that fails (EIO), bytes that fail
// their check on the way back (kCorrupt), a full tier, and completions that take their time.
//
// Completions are held until the test releases them (complete_next / complete_all) unless
// `auto_complete` is set, in which case they are ready as soon as submit returns. Its wake_fd
// is a real eventfd, readable while completions are ready, so the daemon's epoll loop sees
// it like any device's.
//
// Thread safety: one thread (the test's, playing the event loop).
#pragma once

#include "tiers/slab_allocator.h"
#include "tier.h"

#include <kdn/ipc/fd.h>

#include <deque>
#include <memory>
#include <vector>

namespace kdn::sidecar {

class FaultTier final : public Tier {
 public:
  static Result<std::unique_ptr<FaultTier>> create(TierId id, uint64_t capacity_bytes, uint64_t slab_bytes) noexcept;

  // ---- faults and pacing (test side)
  bool auto_complete = false;
  // The next transfer in `direction` completes with `status` (reads leave the host buffer
  // untouched when it fails).
  void fail_next(Transfer::Direction direction, Status status) { faults_.push_back({direction, status}); }
  // Allocations fail with kNoSpace while set.
  bool full = false;
  // Releases held completions (oldest first); returns how many.
  size_t complete_next(size_t n = 1) noexcept;
  size_t complete_all() noexcept { return complete_next(SIZE_MAX); }
  size_t held() const noexcept { return held_.size(); }
  // The stored bytes of a placement (tests inspect or damage them).
  std::byte* bytes_at(const Placement& p) noexcept { return storage_.data() + p.offset; }
  uint64_t transfers(Transfer::Direction d) const noexcept {
    return d == Transfer::Direction::kRead ? reads_ : writes_;
  }

  // ---- Tier
  TierId id() const noexcept override { return id_; }
  TierCapabilities capabilities() const noexcept override { return {false, true, false}; }
  uint64_t capacity_bytes() const noexcept override { return alloc_.capacity(); }
  uint64_t used_bytes() const noexcept override { return alloc_.used_bytes(); }
  Result<uint16_t> slot_class(uint64_t bytes) noexcept override;
  Result<Placement> allocate(uint64_t bytes) noexcept override;
  void free(const Placement& placement) noexcept override;
  Status submit(const Transfer& t) noexcept override;
  int wake_fd() const noexcept override { return wake_.get(); }
  size_t reap(std::span<TierCompletion> out) noexcept override;
  uint64_t in_flight() const noexcept override { return held_.size() + ready_.size(); }

 private:
  struct Fault {
    Transfer::Direction direction;
    Status status;
  };
  struct Pending {
    Transfer transfer;
    Status status;
  };
  FaultTier(TierId id, uint64_t capacity, uint64_t slab, ipc::UniqueFd wake);
  void finish(const Pending& p) noexcept;

  TierId id_;
  SlabAllocator alloc_;
  std::vector<std::byte> storage_;
  ipc::UniqueFd wake_;
  std::deque<Fault> faults_;
  std::deque<Pending> held_;
  std::deque<TierCompletion> ready_;
  uint64_t reads_ = 0, writes_ = 0;
};

}  // namespace kdn::sidecar
