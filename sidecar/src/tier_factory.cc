#include "tier_factory.h"

#include "disk/disk_tier.h"
#include "tiers/eviction.h"
#include "remote_tier.h"

#include <kdn/common/clock.h>

#include <poll.h>
#include <spdlog/fmt/ranges.h>
#include <spdlog/spdlog.h>

namespace kdn::sidecar {

namespace {

// T2: the namespace's slab file in every directory of tier.disk.dirs, and what they held.
Status open_disk_tier(const Config& cfg, Namespace& ns, TierSetup& setup) {
  DiskTierOptions o;
  o.dirs = cfg.disk.dirs;
  o.name_space = ns.name;
  o.bytes_per_dir = ns.policy.disk_bytes ? ns.policy.disk_bytes : cfg.disk.bytes;
  o.slab_bytes = cfg.disk.slab_bytes;
  o.queue_depth = cfg.disk.queue_depth;
  o.register_buffers = cfg.disk.register_buffers;
  o.workers = cfg.disk.workers;
  (void)disk::parse_disk_codec(ns.policy.disk_codec, &o.codec);
  o.encode_queue = cfg.disk.encode_queue;
  o.reencode = cfg.disk.reencode;
  o.fsync_batch = cfg.disk.fsync == "batch";
  o.arena = std::span(ns.host->arena().data(), ns.host->arena().size());
  spdlog::info("namespace '{}': opening the disk tier ({} dir(s), {} MiB each, codec {}, {})", ns.name, o.dirs.size(),
               o.bytes_per_dir >> 20, disk::disk_codec_name(o.codec), cfg.disk.policy);
  RecoveryReport report;
  auto disk = DiskTier::open(o, DiskIo::system(), &setup.recovered, &report);
  if (!disk.ok()) {
    spdlog::error("namespace '{}': the disk tier did not open: {}", ns.name, disk.status().what());
    return disk.status();
  }
  setup.recovered_in = TierId::kDisk;
  spdlog::info(
      "namespace '{}': disk tier ready: {} chunks ({} MiB) recovered from {} slot headers in {} slabs in "
      "{:.3f} s ({} older copies, {} empty or invalid slots){}",
      ns.name, report.chunks, report.bytes >> 20, report.headers_read, report.slabs_scanned, report.seconds,
      report.stale, report.invalid, report.created ? "; new slab file(s) created" : "");
  EvictionKind ev = EvictionKind::kLru;
  (void)parse_eviction_kind(cfg.disk.eviction, &ev);
  setup.tiers[tier_index(TierId::kDisk)] = disk->get();
  setup.rules[tier_index(TierId::kHost)].on_evict = EvictAction::kDemote;
  setup.rules[tier_index(TierId::kDisk)] = TierRules{EvictAction::kDrop, ev};
  setup.store.write_through = cfg.disk.policy == "write_through";
  ns.lower[tier_index(TierId::kDisk)] = std::move(*disk);
  return OkStatus();
}

// T3: the namespace's own client (connections, slot map) to the store the configuration names.
// kdnd does not start against a store it cannot use: the seeds must answer a lookup within
// the request deadline (and be a cluster in cluster mode), so a typo or a firewall is an error
// at start, not a silent miss on every request.
Status open_remote_tier(const Config& cfg, Namespace& ns, TierSetup& setup) {
  const RemoteTierConfig& rc = cfg.remote;
  RemoteTierOptions o;
  for (const std::string& seed : rc.seeds) o.redis.seeds.push_back(*parse_address(seed));  // validate() parsed them
  o.redis.cluster = rc.mode != "standalone";
  o.redis.pool_size = rc.pool;
  o.redis.conn.username = rc.username;
  o.redis.conn.connect_timeout = std::chrono::milliseconds(rc.timeout_ms);
  if (!rc.password_file.empty()) {
    std::string error;
    const std::string what = "tier.remote.password_file = \"" + rc.password_file + "\"";
    if (Status st = read_secret_file(rc.password_file, what, 4096, &o.redis.conn.password, &error); !st.ok()) {
      spdlog::error("{}", error.empty() ? st.what() : error);
      return st;
    }
  }
  o.name_space = ns.name;
  o.timeout = std::chrono::milliseconds(rc.timeout_ms);
  o.capacity_bytes = rc.bytes;
  o.max_in_flight = rc.max_in_flight;
  // Uploads are in the background: a burst of commits waits for the encoders (up to an eighth
  // of the transfers, so reads always find room) rather than going raw at once.
  o.encode_queue = std::max(4u, rc.max_in_flight / 8);
  o.encode_wait = std::chrono::milliseconds(10'000);
  (void)remote::parse_remote_codec(ns.policy.remote_codec, &o.codec);
  const std::string where = (rc.mode == "standalone" ? "the Redis server " : "the Redis Cluster seeds ") +
                            fmt::format("{}", fmt::join(rc.seeds, ", "));
  auto remote = RemoteTier::create(o);
  if (!remote.ok()) {
    spdlog::error("namespace '{}': the remote tier at {} did not open: {}", ns.name, where, remote.status().what());
    return remote.status();
  }
  // One lookup of a key nobody writes, waited for here: it connects, loads the slot map and
  // authenticates, or says why not.
  RemoteTier& t = **remote;
  const uint64_t t0 = now_ns();
  std::vector<uint8_t> exists;
  const ChunkIdentity nothing{};
  Status st = t.probe(1, std::span(&nothing, 1), &exists);
  TierCompletion done{};
  while (st.ok() && t.reap(std::span(&done, 1)) == 0) {
    pollfd p{t.poll_fd(), POLLIN, 0};
    (void)::poll(&p, 1, 10);
    t.service();
  }
  if (st.ok()) st = done.status;
  if (!st.ok()) {
    const Status refresh = t.client().refresh_status();
    spdlog::error("namespace '{}': {} did not answer a lookup within tier.remote.timeout_ms = {}: {}{}{}", ns.name,
                  where, rc.timeout_ms, st.what(),
                  refresh.ok() ? "" : "; the slot map: ", refresh.ok() ? "" : refresh.what());
    return Status(Code::kUnavailable, "the remote tier is unreachable");
  }
  setup.tiers[tier_index(TierId::kRemote)] = remote->get();
  setup.rules[tier_index(TierId::kRemote)] = TierRules{EvictAction::kDrop, EvictionKind::kLru};
  // write_back without a disk tier: the host tier's evictions are uploads (with one, the
  // store uploads what the disk demotion took out of memory).
  const bool disk = setup.tiers[tier_index(TierId::kDisk)] != nullptr;
  if (rc.policy == "write_back" && !disk) setup.rules[tier_index(TierId::kHost)].on_evict = EvictAction::kDemote;
  setup.store.upload = rc.policy == "write_back" ? StoreOptions::Upload::kBack : StoreOptions::Upload::kThrough;
  ns.lower[tier_index(TierId::kRemote)] = std::move(*remote);
  spdlog::info(
      "namespace '{}': remote tier ready: {} ({} connection(s) per master, timeout {} ms, {}, codec {}), "
      "answered in {:.1f} ms",
      ns.name, where, rc.pool, rc.timeout_ms, rc.policy, ns.policy.remote_codec, (now_ns() - t0) / 1e6);
  return OkStatus();
}

}  // namespace

Status open_lower_tiers(const Config& cfg, bool configured, Namespace& ns, TierSetup& setup) {
  setup.store.drop_on_failed_demotion = cfg.disk.write_error != "keep";
  if (!configured) return OkStatus();
  if (!cfg.disk.dirs.empty()) KDN_RETURN_IF_ERROR(open_disk_tier(cfg, ns, setup));
  if (!cfg.remote.seeds.empty()) KDN_RETURN_IF_ERROR(open_remote_tier(cfg, ns, setup));
  return OkStatus();
}

}  // namespace kdn::sidecar
