// TierPolicy: the rules that move chunks between a namespace's tiers, and one eviction policy
// per tier.
//
//   eviction   a tier that needs room evicts by its own EvictionPolicy (LRU or S3-FIFO);
//              the evicted copy is *demoted* to the next tier below that is present when the
//              tier's rule says so (it stays readable where it is until the write lands), and
//              dropped otherwise — also when a lower tier already holds a copy, which makes
//              the eviction free.
//   promotion  a lease on a chunk whose only copies sit below the host tier promotes it into
//              the host arena (read-ahead: the chunks after it in the request too); the
//              lease completes when the bytes are there.
//
// The TieredStore carries these decisions out; the policy itself holds no chunk state
// besides the eviction queues. Not thread-safe: the event loop owns it.
#pragma once

#include "tiers/eviction.h"
#include "tier.h"

#include <array>
#include <memory>
#include <optional>

namespace kdn::sidecar {

enum class EvictAction : uint8_t {
  kDrop,    // the copy leaves the node (unless another tier holds one)
  kDemote,  // the copy is written to the next tier below first
};

struct TierRules {
  EvictAction on_evict = EvictAction::kDrop;
  EvictionKind eviction = EvictionKind::kLru;
};

class TierPolicy {
 public:
  // tiers[t] may be null (tier t absent); the host tier must be present.
  TierPolicy(std::array<Tier*, kTierCount> tiers, std::array<TierRules, kTierCount> rules);

  Tier* tier(TierId t) const noexcept { return tiers_[tier_index(t)]; }
  EvictionPolicy& eviction(TierId t) noexcept { return *eviction_[tier_index(t)]; }
  // Where a copy evicted from `from` is written first, or none when it is dropped.
  std::optional<TierId> demotion_target(TierId from) const noexcept;
  // Whether tier t holds copies a lease can be promoted from (present and below the host).
  bool promotes_from(TierId t) const noexcept {
    return tier(t) != nullptr && tier_index(t) > tier_index(TierId::kHost);
  }

 private:
  std::array<Tier*, kTierCount> tiers_;
  std::array<TierRules, kTierCount> rules_;
  std::array<std::unique_ptr<EvictionPolicy>, kTierCount> eviction_;
};

}  // namespace kdn::sidecar
