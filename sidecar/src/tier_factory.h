// The tier factory: every tier below the host arena is built here, from the configuration, for
// one namespace — T2 (NVMe slabs) and T3 (a Redis store) today — together with the rules the
// store applies to them and the store's options that follow. The daemon names no concrete tier:
// a new one is its class and a step here.
//
// Only namespaces declared in the configuration get lower tiers: a client-created namespace is
// released with its memory after namespace_grace_s, and a persistent copy of it would outlive it.
//
// Loop thread only (the daemon opens namespaces on its event loop).
#pragma once

#include "session.h"
#include "tier_policy.h"
#include "tiered_store.h"

#include <kdn/sidecar/config.h>

#include <array>
#include <vector>

namespace kdn::sidecar {

// What the store of a namespace is built from.
struct TierSetup {
  std::array<Tier*, kTierCount> tiers{};  // by TierId; the host's is the caller's
  std::array<TierRules, kTierCount> rules{};
  StoreOptions store;
  TierId recovered_in = TierId::kHost;    // the tier `recovered` lies in
  std::vector<RecoveredChunk> recovered;  // found at start, for the store to adopt
};

// Opens the lower tiers the configuration gives `ns` into ns.lower (its host tier is open) and
// completes `setup`, whose host entries the caller has filled. Errors are logged naming the
// tier and the cause (a missing directory, an unreachable store), and kdnd does not start.
Status open_lower_tiers(const Config& cfg, bool configured, Namespace& ns, TierSetup& setup);

}  // namespace kdn::sidecar
