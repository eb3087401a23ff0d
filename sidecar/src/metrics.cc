#include "metrics.h"

#include "gpu/gpu_service.h"

#include <kdn/common/files.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <iterator>
#include <sstream>

namespace kdn::sidecar {

namespace {

// Hits by operation and tier, misses by operation, bytes by tier and direction: every read
// path counts (a lease-only engine shows its hit ratio too).
template <class Metric>
void read_path_families(std::ostream& o, const std::vector<NamespaceMetrics>& ns, Metric metric) {
  auto tiers_of = [](const NamespaceMetrics& n, auto visit) {
    for (uint32_t t = 0; t < kTierCount; ++t)
      if (n.ns->store->policy().tier(TierId(t)) != nullptr) visit(t, tier_name(TierId(t)));
  };
  metric("kdn_hit_chunks_total", "counter",
         "Chunks found, by operation and by the tier they were found in (lookups: the fastest copy; "
         "leases: host, or the tier a promotion brought them from).");
  for (const NamespaceMetrics& n : ns)
    for (size_t op = 0; op < kReadOps; ++op)
      tiers_of(n, [&](uint32_t t, const char* tier) {
        o << "kdn_hit_chunks_total{namespace=\"" << n.name << "\",op=\"" << read_op_name(ReadOp(op)) << "\",tier=\""
          << tier << "\"} " << n.ns->store->counters().hit_chunks[op][t] << '\n';
      });
  metric("kdn_miss_chunks_total", "counter", "Chunks asked for and not found in any tier, by operation.");
  for (const NamespaceMetrics& n : ns)
    for (size_t op = 0; op < kReadOps; ++op)
      o << "kdn_miss_chunks_total{namespace=\"" << n.name << "\",op=\"" << read_op_name(ReadOp(op)) << "\"} "
        << n.ns->store->counters().miss_chunks[op] << '\n';
  metric("kdn_tier_bytes_total", "counter",
         "Canonical bytes into a tier (commits, promotions, demotions, write-downs) and out of it "
         "(leased to engines from the host tier, copied to another tier).");
  for (const NamespaceMetrics& n : ns)
    tiers_of(n, [&](uint32_t t, const char* tier) {
      for (const Flow f : {Flow::kIn, Flow::kOut})
        o << "kdn_tier_bytes_total{namespace=\"" << n.name << "\",tier=\"" << tier << "\",direction=\""
          << (f == Flow::kIn ? "in" : "out") << "\"} " << n.ns->store->counters().tier_bytes[t][size_t(f)] << '\n';
    });
}

// The lower tiers' own counters (each tier describes them: Tier::describe_metrics), then what the
// store counts of them, for the namespaces that have them; a family's samples stay together.
template <class Metric>
void tier_families(std::ostream& o, const std::vector<NamespaceMetrics>& ns, Metric metric) {
  struct Family {
    std::string name;
    MetricsSink::Kind kind;
    const char* help;
    std::vector<std::pair<const std::string*, uint64_t>> samples;
  };
  struct Collector final : MetricsSink {
    std::vector<Family> families;
    const std::string* ns = nullptr;
    void add(const char* name, Kind kind, const char* help, uint64_t value) override {
      auto f = std::find_if(families.begin(), families.end(), [&](const Family& x) { return x.name == name; });
      if (f == families.end()) f = families.insert(families.end(), Family{name, kind, help, {}});
      f->samples.emplace_back(ns, value);
    }
  } c;
  for (const NamespaceMetrics& n : ns) {
    c.ns = &n.name;
    n.ns->for_each_lower([&](const Tier& t) { t.describe_metrics(c); });
  }
  using Get = uint64_t (*)(const StoreCounters&);
  struct StoreCol {
    const char* name;
    const char* help;
    TierId tier;
    Get get;
  };
  static const StoreCol store_cols[] = {
      {"kdn_disk_recovered_chunks", "Chunks found on disk at start.", TierId::kDisk,
       [](const StoreCounters& k) { return k.recovered_chunks; }},
      {"kdn_remote_probes_total", "Remote lookups on local misses (one pipelined EXISTS batch each).", TierId::kRemote,
       [](const StoreCounters& k) { return k.remote_probes; }},
      {"kdn_remote_probe_keys_total", "Keys those lookups asked about.", TierId::kRemote,
       [](const StoreCounters& k) { return k.remote_probe_keys; }},
      {"kdn_remote_found_chunks_total", "Chunks remote lookups found (other nodes' or earlier uploads).",
       TierId::kRemote, [](const StoreCounters& k) { return k.remote_found_chunks; }},
      {"kdn_remote_failed_probes_total",
       "Remote lookups that did not fully answer in time (what did not answer is a miss).", TierId::kRemote,
       [](const StoreCounters& k) { return k.remote_failed_probes; }},
      {"kdn_remote_uploads_total", "Chunks uploaded to the remote tier.", TierId::kRemote,
       [](const StoreCounters& k) { return k.uploaded_chunks; }},
      {"kdn_remote_failed_uploads_total", "Uploads that failed (the chunk stayed on this node alone).", TierId::kRemote,
       [](const StoreCounters& k) { return k.failed_uploads; }},
  };
  for (const StoreCol& col : store_cols) {
    for (const NamespaceMetrics& n : ns) {
      if (n.ns->tier(col.tier) == nullptr) continue;
      c.ns = &n.name;
      c.add(col.name, col.tier == TierId::kDisk ? MetricsSink::Kind::kGauge : MetricsSink::Kind::kCounter, col.help,
            col.get(n.ns->store->counters()));
    }
  }
  for (const Family& f : c.families) {
    metric(f.name.c_str(), f.kind == MetricsSink::Kind::kCounter ? "counter" : "gauge", f.help);
    for (const auto& [name, value] : f.samples) o << f.name << "{namespace=\"" << *name << "\"} " << value << '\n';
  }
}

}  // namespace

namespace {

// The GPU tier: whether it serves (and why not), its counters, and each device's T0.
void gpu_text(std::ostringstream& o, const gpu::GpuService& g) {
  auto metric = [&](const char* name, const char* type, const char* help) {
    o << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n';
  };
  metric("kdn_gpu_enabled", "gauge", "1 when the GPU tier serves requests; reason says why not.");
  std::string reason = g.off_reason();
  for (char& ch : reason)
    if (ch == '"' || ch == '\\' || ch == '\n') ch = ' ';
  o << "kdn_gpu_enabled{reason=\"" << reason << "\"} " << (g.enabled() ? 1 : 0) << '\n';
  if (!g.enabled()) return;
  const gpu::GpuCounters& c = g.counters();
  const gpu::LandingStats landings = g.landing_stats();
  const struct {
    const char* name;
    const char* type;
    const char* help;
    uint64_t value;
  } rows[] = {
      {"kdn_gpu_registrations", "gauge", "Engine memory registrations open.", uint64_t(g.registrations())},
      {"kdn_gpu_registrations_total", "counter", "GPU_REGISTER requests served.", c.registrations},
      {"kdn_gpu_stale_refused_total", "counter", "Requests naming an unknown or stale registration.", c.stale_refused},
      {"kdn_gpu_bounds_refused_total", "counter", "Layouts refused for reaching outside their registration.",
       c.bounds_refused},
      {"kdn_gpu_retrieves_total", "counter", "GPU_RETRIEVE requests whose copies were queued.", c.retrieves},
      {"kdn_gpu_retrieved_chunks_total", "counter", "Chunks scattered into engine memory.", c.retrieved_chunks},
      {"kdn_gpu_stores_total", "counter", "GPU_STORE requests whose gathers were queued.", c.stores},
      {"kdn_gpu_blend_selects_total", "counter", "GPU_BLEND_SELECT requests whose comparisons were queued.",
       c.blend_selects},
      {"kdn_gpu_blend_chunks_total", "counter", "Chunks compared by blend selections.", c.blend_chunks},
      {"kdn_gpu_h2d_bytes_total", "counter", "Bytes copied from the host tier to devices.", c.h2d_bytes},
      {"kdn_gpu_d2h_bytes_total", "counter", "Bytes copied from devices to the host tier.", c.d2h_bytes},
      {"kdn_gpu_peer_chunks_total", "counter", "Chunks read from another device's T0 (peer access).", c.peer_chunks},
      {"kdn_gpu_staged_chunks_total", "counter", "Chunks served through the bounce buffer (no T0 slot).",
       c.staged_chunks},
      {"kdn_gpu_failed_batches_total", "counter", "Copy batches that failed on the device or could not be queued.",
       c.batches_failed},
      {"kdn_gpu_t0_encoded_total", "counter", "Chunks encoded into T0 blobs (tier.gpu.codec).", c.t0_encoded},
      {"kdn_gpu_t0_device_encoded_total", "counter", "GPU_STORE chunks encoded for T0 on the device.",
       c.t0_device_encoded},
      {"kdn_gpu_t0_encode_failed_total", "counter", "Chunks the T0 codec refused (served from the host tier).",
       c.t0_encode_failed},
      {"kdn_gpu_t0_decoded_chunks_total", "counter", "Chunks decoded from T0 blobs on a device.", c.t0_decoded_chunks},
      {"kdn_gpu_t0_decode_faults_total", "counter",
       "Chunks whose T0 blob failed to decode on the device (entry dropped).", c.t0_decode_faults},
      {"kdn_gpu_landing_pinned_total", "counter", "Host buffers page-locked for device encodes to land in.",
       landings.pinned},
      {"kdn_gpu_landing_reused_total", "counter", "Device-encode landings served by an idle pinned buffer.",
       landings.reused},
      {"kdn_gpu_landing_unpinned_total", "counter",
       "Landing buffers unlocked and freed (past staging_bytes idle); pinned - unpinned are locked now.",
       landings.unpinned},
      {"kdn_gpu_landing_idle_bytes", "gauge", "Pinned landing buffers kept for the next store (bytes).",
       landings.idle_bytes},
  };
  for (const auto& r : rows) {
    metric(r.name, r.type, r.help);
    o << r.name << ' ' << r.value << '\n';
  }
  metric("kdn_gpu_t0_codec", "gauge", "1, labelled with what T0 holds (tier.gpu.codec).");
  o << "kdn_gpu_t0_codec{codec=\"" << g.t0_codec() << "\"} 1\n";
  const auto devs = g.device_stats();
  using Get = uint64_t (*)(const gpu::DeviceStats&);
  const struct {
    const char* name;
    const char* type;
    const char* help;
    Get get;
  } per_dev[] = {
      {"kdn_gpu_t0_capacity_bytes", "gauge", "T0 bytes of the device.",
       [](const gpu::DeviceStats& s) { return s.t0_capacity; }},
      {"kdn_gpu_t0_used_bytes", "gauge", "T0 bytes held by slots.",
       [](const gpu::DeviceStats& s) { return s.t0_used; }},
      {"kdn_gpu_t0_resident_chunks", "gauge", "Chunks with a T0 copy.",
       [](const gpu::DeviceStats& s) { return s.t0_chunks; }},
      {"kdn_gpu_t0_hits_total", "counter", "Chunks served from a T0 copy.",
       [](const gpu::DeviceStats& s) { return s.t0.hits; }},
      {"kdn_gpu_t0_promoted_chunks_total", "counter", "Chunks copied from the host tier into T0.",
       [](const gpu::DeviceStats& s) { return s.t0.promoted; }},
      {"kdn_gpu_t0_evicted_chunks_total", "counter", "T0 copies dropped to make room (a host copy remains).",
       [](const gpu::DeviceStats& s) { return s.t0.evicted; }},
      {"kdn_gpu_t0_raw_bytes", "gauge", "Canonical bytes of the chunks T0's blobs encode (tier.gpu.codec).",
       [](const gpu::DeviceStats& s) { return s.t0_raw_bytes; }},
      {"kdn_gpu_t0_stored_bytes", "gauge", "Bytes of the blobs in T0 (tier.gpu.codec).",
       [](const gpu::DeviceStats& s) { return s.t0_stored_bytes; }},
      {"kdn_gpu_peer_mask", "gauge", "Bit j: the device can read device j's memory.",
       [](const gpu::DeviceStats& s) { return s.peer_mask; }},
  };
  for (const auto& m : per_dev) {
    metric(m.name, m.type, m.help);
    for (const gpu::DeviceStats& s : devs) o << m.name << "{device=\"" << s.info.ordinal << "\"} " << m.get(s) << '\n';
  }
}

// What concerns the whole daemon, every tenant's traffic together.
template <class Metric>
void daemon_families(std::ostringstream& o, const DaemonCounters& d, Metric metric) {
  metric("kdn_sessions", "gauge", "Connected client sessions.");
  o << "kdn_sessions " << d.sessions_active << '\n';
  metric("kdn_sessions_total", "counter", "Sessions ever admitted.");
  o << "kdn_sessions_total " << d.sessions_total << '\n';
  metric("kdn_requests_total", "counter", "Ring requests served.");
  o << "kdn_requests_total " << d.requests << '\n';
  metric("kdn_protocol_errors_total", "counter", "Malformed requests or corrupted rings.");
  o << "kdn_protocol_errors_total " << d.protocol_errors << '\n';
  metric("kdn_handshakes_refused_total", "counter", "Connections refused before they became sessions, by reason.");
  for (size_t r = 0; r < size_t(Refusal::kCount); ++r)
    o << "kdn_handshakes_refused_total{reason=\"" << refusal_name(Refusal(r)) << "\"} " << d.refused[r] << '\n';
  metric("kdn_pending_handshakes", "gauge", "Connections accepted whose hello has not arrived.");
  o << "kdn_pending_handshakes " << d.pending_handshakes << '\n';
  metric("kdn_limit_errors_total", "counter", "Requests and handshakes refused by a configured limit.");
  o << "kdn_limit_errors_total " << d.limit_errors << '\n';
  metric("kdn_namespaces", "gauge", "Namespaces with an arena.");
  o << "kdn_namespaces " << d.namespaces << '\n';
}

// Request latency by opcode, of every session together.
template <class Metric>
void latency_family(std::ostringstream& o, const DaemonCounters& d, Metric metric) {
  metric("kdn_request_duration_seconds", "histogram",
         "Requests by opcode, from kdnd's first look at a request to its completion (op=\"other\": unknown opcodes).");
  for (size_t op = 0; op < DaemonCounters::kOpcodeSlots; ++op) {
    std::string name = op == 0 ? "other" : ipc::opcode_name(uint8_t(op));
    if (name == "unknown") continue;
    for (char& ch : name) ch = char(std::tolower(static_cast<unsigned char>(ch)));
    const LatencyHistogram& h = d.latency[op];
    uint64_t cumulative = 0;
    for (size_t b = 0; b < LatencyHistogram::kBuckets; ++b) {
      cumulative += h.buckets[b];
      o << "kdn_request_duration_seconds_bucket{op=\"" << name << "\",le=\"";
      if (b < std::size(LatencyHistogram::kBoundsNs))
        o << double(LatencyHistogram::kBoundsNs[b]) / 1e9;
      else
        o << "+Inf";
      o << "\"} " << cumulative << '\n';
    }
    o << "kdn_request_duration_seconds_sum{op=\"" << name << "\"} " << double(h.sum_ns) / 1e9 << '\n';
    o << "kdn_request_duration_seconds_count{op=\"" << name << "\"} " << h.count << '\n';
  }
}

}  // namespace

std::string prometheus_text(const DaemonCounters* d_or_null, const std::vector<NamespaceMetrics>& ns,
                            const gpu::GpuService* gpu) {
  std::ostringstream o;
  auto metric = [&](const char* name, const char* type, const char* help) {
    o << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n';
  };
  if (d_or_null) daemon_families(o, *d_or_null, metric);
  using Get = uint64_t (*)(const Namespace&);
  struct Col {
    const char* name;
    const char* type;
    const char* help;
    Get get;
  };
  static const Col cols[] = {
      {"kdn_namespace_sessions", "gauge", "Open sessions of the namespace.",
       [](const Namespace& n) -> uint64_t { return n.sessions; }},
      {"kdn_lookups_total", "counter", "LOOKUP and LOOKUP_EACH requests.",
       [](const Namespace& n) { return n.store->counters().lookups; }},
      {"kdn_lookup_hit_chunks_total", "counter", "Chunks found by LOOKUP and LOOKUP_EACH.",
       [](const Namespace& n) { return n.store->counters().lookup_hit_chunks; }},
      {"kdn_lookup_miss_chunks_total", "counter", "Chunks missed by LOOKUP and LOOKUP_EACH.",
       [](const Namespace& n) { return n.store->counters().lookup_miss_chunks; }},
      {"kdn_leases_total", "counter", "LEASE and LEASE_EACH requests.",
       [](const Namespace& n) { return n.store->counters().leases; }},
      {"kdn_lease_hit_chunks_total", "counter", "Chunks leased by LEASE and LEASE_EACH.",
       [](const Namespace& n) { return n.store->counters().lease_hit_chunks; }},
      {"kdn_lease_miss_chunks_total", "counter", "Chunks missed by LEASE and LEASE_EACH.",
       [](const Namespace& n) { return n.store->counters().lease_miss_chunks; }},
      {"kdn_stored_chunks_total", "counter", "Chunks committed.",
       [](const Namespace& n) { return n.store->counters().stored_chunks; }},
      {"kdn_stored_bytes_total", "counter", "Bytes committed.",
       [](const Namespace& n) { return n.store->counters().stored_bytes; }},
      {"kdn_retrieved_chunks_total", "counter", "Chunks leased to readers.",
       [](const Namespace& n) { return n.store->counters().retrieved_chunks; }},
      {"kdn_retrieved_bytes_total", "counter", "Bytes leased to readers.",
       [](const Namespace& n) { return n.store->counters().retrieved_bytes; }},
      {"kdn_aborted_chunks_total", "counter",
       "Reserved chunks aborted (by the client, its exit or the reservation timeout).",
       [](const Namespace& n) { return n.store->counters().aborted_chunks; }},
      {"kdn_demoted_chunks_total", "counter", "Copies written down to a lower tier.",
       [](const Namespace& n) { return n.store->counters().demoted_chunks; }},
      {"kdn_promoted_chunks_total", "counter", "Copies brought up from a lower tier.",
       [](const Namespace& n) { return n.store->counters().promoted_chunks; }},
      {"kdn_transfer_errors_total", "counter", "Transfers a tier failed (the data stayed where it was).",
       [](const Namespace& n) { return n.store->counters().transfer_errors; }},
      {"kdn_evicted_chunks_total", "counter", "Copies evicted from a tier to make room.",
       [](const Namespace& n) { return n.store->counters().evicted_chunks; }},
      {"kdn_dropped_chunks_total", "counter", "Chunks that left the namespace.",
       [](const Namespace& n) { return n.store->counters().dropped_chunks; }},
      {"kdn_corrupt_chunks_total", "counter", "Copies found damaged and dropped, never served.",
       [](const Namespace& n) { return n.store->counters().corrupt_chunks; }},
      {"kdn_active_leases", "gauge", "Leases held.", [](const Namespace& n) { return n.store->active_leases(); }},
      {"kdn_open_reservations", "gauge", "Reservations not yet committed.",
       [](const Namespace& n) { return n.store->open_reservations(); }},
      {"kdn_expired_reservations_total", "counter", "Reservations aborted by the reservation timeout.",
       [](const Namespace& n) { return n.counters.expired_reservations; }},
      {"kdn_yielded_reservations_total", "counter",
       "Reservations aborted so that a writer holding fewer reserved bytes found room in a full arena.",
       [](const Namespace& n) { return n.counters.yielded_reservations; }},
      {"kdn_staging_bytes", "gauge", "Staging areas of the namespace's sessions.",
       [](const Namespace& n) { return n.staging_bytes; }},
      {"kdn_host_prefault_left_bytes", "gauge", "Host arena bytes still to be faulted in after start.",
       [](const Namespace& n) { return n.prefault_left.load(std::memory_order_relaxed); }},
  };
  for (const Col& c : cols) {
    metric(c.name, c.type, c.help);
    for (const NamespaceMetrics& n : ns) o << c.name << "{namespace=\"" << n.name << "\"} " << c.get(*n.ns) << '\n';
  }
  tier_families(o, ns, metric);
  read_path_families(o, ns, metric);
  struct TierCol {
    const char* name;
    const char* help;
    bool capacity;
    bool bytes;
  };
  static const TierCol tier_cols[] = {
      {"kdn_resident_chunks", "Chunks with a copy in the tier.", false, false},
      {"kdn_resident_bytes", "Bytes of the copies in the tier.", false, true},
      {"kdn_capacity_bytes", "Capacity of the tier.", true, true},
  };
  for (const TierCol& c : tier_cols) {
    metric(c.name, "gauge", c.help);
    for (const NamespaceMetrics& n : ns) {
      for (uint32_t t = 0; t < kTierCount; ++t) {
        const Tier* tier = n.ns->store->policy().tier(TierId(t));
        if (tier == nullptr) continue;
        const StoreCounters& k = n.ns->store->counters();
        const uint64_t v = c.capacity ? tier->capacity_bytes() : c.bytes ? k.resident_bytes[t] : k.resident_chunks[t];
        o << c.name << "{namespace=\"" << n.name << "\",tier=\"" << tier_name(TierId(t)) << "\"} " << v << '\n';
      }
    }
  }
  if (d_or_null) latency_family(o, *d_or_null, metric);
  if (gpu) gpu_text(o, *gpu);
  return o.str();
}

Status write_prometheus_file(const std::string& path, const DaemonCounters& d, const std::vector<NamespaceMetrics>& ns,
                             std::string* error, const gpu::GpuService* gpu) {
  return write_file_atomically(path, prometheus_text(&d, ns, gpu), 0600, error);
}

}  // namespace kdn::sidecar
