// AdminClient: an admin session speaking kdn's protocol directly (ipc/), for what libkdn's C
// ABI leaves to operators: EVICT (kdnctl evict, including --tier host) and TIER_STATS (kdnctl
// stats). Benchmarks use it to put chunks where a measurement needs them.
//
// Ownership: owns its connection. Thread safety: none; one thread at a time.
#pragma once

#include <kdn/ipc/fd.h>
#include <kdn/ipc/protocol.h>
#include <kdn/ipc/session.h>

#include <cstdint>
#include <optional>
#include <string>

namespace kdn::bench {

class AdminClient {
 public:
  // Connects to `socket` in namespace `ns`, asking for admin rights; ok() says whether they
  // were granted (kdnd grants them to the uids its configuration names; its own by default).
  AdminClient(const std::string& socket, const std::string& ns);
  bool ok() const noexcept { return ok_; }

  // Every unleased chunk leaves the arena for the disk tier; returns once the writes landed.
  bool demote_all();
  // Every unleased chunk leaves every tier (kdnctl evict --all).
  bool evict_all();
  // EVICT in `mode` (the keys only for EvictMode::kByKeys; at most 4096 of them): the
  // kdn_status kdnd answered, and in *evicted the chunks that left (may be null).
  int evict(ipc::EvictMode mode, const kdn_key* keys, size_t n_keys, uint64_t* evicted);
  // The disk tier's record of TIER_STATS, if the namespace has one.
  std::optional<ipc::TierStatsRecord> disk_stats() { return tier_stats(ipc::ChunkTier::kDisk); }
  // Tier `t`'s record of TIER_STATS, if the namespace has that tier.
  std::optional<ipc::TierStatsRecord> tier_stats(ipc::ChunkTier t);

 private:
  int call(ipc::Sqe q, ipc::Cqe* out);
  ipc::UniqueFd sock_;
  ipc::ClientSession s_;
  bool ok_ = false;
  uint64_t next_ud_ = 1;
};

}  // namespace kdn::bench
