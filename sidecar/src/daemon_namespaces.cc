// Namespaces: opening one (its arena and tiers), its tiers' descriptors in the loop, releasing
// idle created ones, and writing the host tier down to the next tier on stop.
#include "daemon_impl.h"

#include "tier_factory.h"

#include <kdn/common/clock.h>
#include <spdlog/spdlog.h>

namespace kdn::sidecar {
using namespace daemon_detail;

Result<Namespace*> DaemonImpl::open_namespace(const std::string& name, const NamespaceConfig& policy, bool configured) {
  if (namespaces_.size() >= cfg_.max_namespaces) return Status(Code::kLimit, "max_namespaces namespaces exist");
  std::string token;
  std::string error;
  Status tok = load_namespace_token(policy, cfg_, &token, &error);
  if (!tok.ok()) {
    spdlog::error("namespace '{}': {}", name, error);
    return tok;
  }
  ipc::SegmentOptions opt;
  opt.populate = false;
  opt.madvise_huge = cfg_.host.hugepages;
  opt.seal_writes = true;  // clients map it read-only; only kdnd's mapping writes chunks
  const uint64_t bytes = policy.max_bytes ? policy.max_bytes : cfg_.host.bytes;
  const std::string seg_name = "kdn-arena-" + name;
  const uint64_t t0 = now_ns();
  auto seg = ipc::SharedSegment::create(seg_name.c_str(), bytes, opt);
  if (!seg.ok()) return seg.status();
  HostArenaOptions ho;
  ho.slab_bytes = cfg_.host.slab_bytes;
  ho.copy_threads = cfg_.host.copy_threads;
  auto host = HostArenaTier::create(std::move(*seg), ho);
  if (!host.ok()) return host.status();
  EvictionKind ev = EvictionKind::kLru;
  (void)parse_eviction_kind(cfg_.host.eviction, &ev);
  TierSetup setup;
  setup.tiers[tier_index(TierId::kHost)] = host->get();
  setup.rules[tier_index(TierId::kHost)] = TierRules{EvictAction::kDrop, ev};
  setup.store.max_demotions = cfg_.host.max_demotions;
  auto ns = std::make_unique<Namespace>();
  ns->name = name;
  ns->policy = policy;
  ns->host = std::move(*host);
  if (gpu_) gpu_->pin_arena(ns->host->arena().data(), ns->host->arena().size());
  KDN_RETURN_IF_ERROR(open_lower_tiers(cfg_, configured, *ns, setup));
  ns->token = token;
  ns->configured = configured;
  auto& region = regions_[name];
  if (region.first == 0) region.first = next_region_++;
  ++region.second;  // memory under this id is new: references to the old arena are stale
  ns->region_id = region.first;
  ns->region_generation = region.second;
  ns->store = std::make_unique<TieredStore>(TierPolicy(setup.tiers, setup.rules), setup.store);
  ns->empty_since_ns = now_ns();
  for (const RecoveredChunk& rc : setup.recovered)
    (void)ns->store->adopt(rc.key, rc.fingerprint, rc.raw_bytes, setup.recovered_in, rc.placement, ns->empty_since_ns);
  KDN_RETURN_IF_ERROR(poll_tiers_of(*ns));
  spdlog::info("namespace '{}': host arena {} MiB mapped in {:.0f} ms{}", name, ns->host->arena().size() >> 20,
               (now_ns() - t0) / 1e6, configured ? "" : " (created by a client)");
  Namespace* raw = ns.get();
  namespaces_.emplace(name, std::move(ns));
  models_.open_group(raw->region_id);  // owed its share of the model table from now on
  counters_.namespaces = namespaces_.size();
  return raw;
}

Status DaemonImpl::poll_tiers_of(const Namespace& ns) {
  for (uint32_t t = tier_index(TierId::kHost); t < kTierCount; ++t) {
    const Tier* tier = ns.tier(TierId(t));
    if (tier == nullptr) continue;
    if (tier->wake_fd() >= 0)
      KDN_RETURN_IF_ERROR(
          poller_.add(tier->wake_fd(), tag(kTierWake, wake_id(ns.region_id, TierId(t), TierFd::kWake))));
    if (tier->poll_fd() >= 0)
      KDN_RETURN_IF_ERROR(
          poller_.add(tier->poll_fd(), tag(kTierWake, wake_id(ns.region_id, TierId(t), TierFd::kPoll))));
  }
  return OkStatus();
}

void DaemonImpl::unpoll_tiers_of(const Namespace& ns) {
  for (uint32_t t = tier_index(TierId::kHost); t < kTierCount; ++t) {
    const Tier* tier = ns.tier(TierId(t));
    if (tier == nullptr) continue;
    if (tier->wake_fd() >= 0) (void)poller_.remove(tier->wake_fd());
    if (tier->poll_fd() >= 0) (void)poller_.remove(tier->poll_fd());
  }
}

// Client-created namespaces without sessions for namespace_grace_s are released with their
// memory (once no transfer can still touch it).
void DaemonImpl::release_namespaces(uint64_t now) {
  const uint64_t grace = uint64_t(cfg_.namespace_grace_s) * 1'000'000'000;
  for (auto it = namespaces_.begin(); it != namespaces_.end();) {
    Namespace& ns = *it->second;
    const bool idle = !ns.configured && ns.sessions == 0 && ns.attached == 0 && ns.store->transfers_in_flight() == 0 &&
                      now - ns.empty_since_ns >= grace;
    if (!idle) {
      ++it;
      continue;
    }
    spdlog::info("namespace '{}' released after {} s without sessions ({} chunks dropped)", ns.name,
                 cfg_.namespace_grace_s, ns.store->index().size());
    unpoll_tiers_of(ns);
    if (gpu_) gpu_->unpin_arena(ns.host->arena().data());  // no GPU batch uses it: attached is 0
    models_.close_group(ns.region_id);
    it = namespaces_.erase(it);
  }
  counters_.namespaces = namespaces_.size();
}

void DaemonImpl::write_down_on_stop() {
  for (auto& [name, ns] : namespaces_) {
    Tier* target = nullptr;
    ns->for_each_lower([&](Tier& t) {
      if (target == nullptr && t.capabilities().indexed_at_start) target = &t;
    });
    if (target == nullptr) continue;
    if (cfg_.disk.flush_on_stop) write_down(name, *ns, *target);
    ns->for_each_lower([](Tier& t) { t.drain(); });
  }
}

// Each chunk is tried once: a tier that fails them all must not keep kdnd from exiting.
void DaemonImpl::write_down(const std::string& name, Namespace& ns, Tier& target) {
  const uint64_t t0 = now_ns();
  uint64_t started = 0, last_log = t0;
  const char* where = tier_name(target.id());
  const uint64_t written_before = ns.store->counters().written_through_chunks;
  const uint64_t budget = ns.store->host_only_chunks();
  if (budget > 0)
    spdlog::info("namespace '{}': writing {} chunks held only in the arena to the {} tier before exiting", name, budget,
                 where);
  for (;;) {
    // Keep the device's queue full, not the whole arena in flight at once.
    const uint64_t room = target.queue_room();
    const uint64_t in_flight = ns.store->transfers_in_flight();
    if (in_flight < room) {
      const uint64_t n = started < budget ? ns.store->write_down(std::min(room - in_flight, budget - started)) : 0;
      started += n;
      if (n == 0 && in_flight == 0) break;
    }
    events_.clear();
    bool room_freed = false;
    if (ns.store->poll(events_, &room_freed) == 0 && ns.store->transfers_in_flight() > 0) (void)target.advance(true);
    if (now_ns() - last_log > 1'000'000'000) {
      spdlog::info("namespace '{}': writing the arena down before exiting: {} chunks so far", name,
                   ns.store->counters().written_through_chunks - written_before);
      last_log = now_ns();
    }
  }
  if (started > 0)
    spdlog::info("namespace '{}': wrote {} arena chunks to the {} tier in {:.2f} s before exiting", name,
                 ns.store->counters().written_through_chunks - written_before, where, (now_ns() - t0) / 1e9);
}

}  // namespace kdn::sidecar
