// Drives a RemoteTier (T3) the way kdnd's event loop does: the tier's client fd and wake fd in
// one epoll set, service() whenever either is readable or the client's next deadline passed,
// every completion reaped. `kdn-bench remote` measures the tier through this loop alone.
//
// Ownership: the loop borrows the tier; the caller keeps both alive together.
// Thread safety: none; the thread that owns the tier.
#pragma once

#include "remote_tier.h"

#include <kdn/common/status.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace kdn::bench {

class TierLoop {
 public:
  explicit TierLoop(sidecar::RemoteTier& tier);
  ~TierLoop();
  TierLoop(const TierLoop&) = delete;
  TierLoop& operator=(const TierLoop&) = delete;

  // Transfers 0..count-1, at most `depth` in flight: make(i) describes transfer i (its id is
  // set here, to i), done(i, status) hears its completion. Returns once every transfer
  // completed, or kTimeout when none completed for `stall`; a transfer the tier refused is
  // reported to done() with the refusal.
  Status transfer_all(size_t count, uint32_t depth, const std::function<sidecar::Transfer(size_t)>& make,
                      const std::function<void(size_t, const Status&)>& done,
                      std::chrono::milliseconds stall = std::chrono::seconds(30));

  // One probe of `chunks` (RemoteTier::probe) waited for; its status, *exists filled.
  Status probe(std::span<const sidecar::ChunkIdentity> chunks, std::vector<uint8_t>* exists,
               std::chrono::milliseconds limit = std::chrono::seconds(10));

 private:
  // Waits for the tier (at most until its next deadline), services it and reaps.
  void turn(std::vector<sidecar::TierCompletion>& out);

  sidecar::RemoteTier& tier_;
  int epoll_fd_ = -1;
  sidecar::TransferId next_probe_id_ = uint64_t(1) << 62;  // apart from transfer ids
};

}  // namespace kdn::bench
