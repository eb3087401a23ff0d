#include "metrics.h"

#include "gpu/gpu_service.h"

#include <kdn/common/files.h>

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
        o << "kdn_hit_chunks_total{namespace=\"" << n.name << "\",op=\"" << read_op_name(ReadOp(op))
          << "\",tier=\"" << tier << "\"} " << n.ns->store->counters().hit_chunks[op][t] << '\n';
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
  const struct {
    const char* name;
    const char* type;
    const char* help;
    uint64_t value;
  } rows[] = {
      {"kdn_gpu_registrations", "gauge", "Engine memory registrations open.", uint64_t(g.registrations())},
      {"kdn_gpu_registrations_total", "counter", "GPU_REGISTER requests served.", c.registrations},
      {"kdn_gpu_stale_refused_total", "counter", "Requests naming an unknown or stale registration.", c.stale_refused},
      {"kdn_gpu_bounds_refused_total", "counter", "Layouts refused for reaching outside their registration.", c.bounds_refused},
      {"kdn_gpu_retrieves_total", "counter", "GPU_RETRIEVE requests whose copies were queued.", c.retrieves},
      {"kdn_gpu_retrieved_chunks_total", "counter", "Chunks scattered into engine memory.", c.retrieved_chunks},
      {"kdn_gpu_stores_total", "counter", "GPU_STORE requests whose gathers were queued.", c.stores},
      {"kdn_gpu_blend_selects_total", "counter", "GPU_BLEND_SELECT requests whose comparisons were queued.", c.blend_selects},
      {"kdn_gpu_blend_chunks_total", "counter", "Chunks compared by blend selections.", c.blend_chunks},
      {"kdn_gpu_h2d_bytes_total", "counter", "Bytes copied from the host tier to devices.", c.h2d_bytes},
      {"kdn_gpu_d2h_bytes_total", "counter", "Bytes copied from devices to the host tier.", c.d2h_bytes},
      {"kdn_gpu_peer_chunks_total", "counter", "Chunks read from another device's T0 (peer access).", c.peer_chunks},
      {"kdn_gpu_staged_chunks_total", "counter", "Chunks served through the bounce buffer (no T0 slot).", c.staged_chunks},
      {"kdn_gpu_failed_batches_total", "counter", "Copy batches that failed on the device or could not be queued.", c.batches_failed},
      {"kdn_gpu_t0_encoded_total", "counter", "Chunks encoded into T0 blobs (tier.gpu.codec).", c.t0_encoded},
      {"kdn_gpu_t0_encode_failed_total", "counter", "Chunks the T0 codec refused (served from the host tier).", c.t0_encode_failed},
      {"kdn_gpu_t0_decoded_chunks_total", "counter", "Chunks decoded from T0 blobs on a device.", c.t0_decoded_chunks},
      {"kdn_gpu_t0_decode_faults_total", "counter", "Chunks whose T0 blob failed to decode on the device (entry dropped).", c.t0_decode_faults},
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
      {"kdn_gpu_t0_capacity_bytes", "gauge", "T0 bytes of the device.", [](const gpu::DeviceStats& s) { return s.t0_capacity; }},
      {"kdn_gpu_t0_used_bytes", "gauge", "T0 bytes held by slots.", [](const gpu::DeviceStats& s) { return s.t0_used; }},
      {"kdn_gpu_t0_resident_chunks", "gauge", "Chunks with a T0 copy.", [](const gpu::DeviceStats& s) { return s.t0_chunks; }},
      {"kdn_gpu_t0_hits_total", "counter", "Chunks served from a T0 copy.", [](const gpu::DeviceStats& s) { return s.t0.hits; }},
      {"kdn_gpu_t0_promoted_chunks_total", "counter", "Chunks copied from the host tier into T0.", [](const gpu::DeviceStats& s) { return s.t0.promoted; }},
      {"kdn_gpu_t0_evicted_chunks_total", "counter", "T0 copies dropped to make room (a host copy remains).", [](const gpu::DeviceStats& s) { return s.t0.evicted; }},
      {"kdn_gpu_t0_raw_bytes", "gauge", "Canonical bytes of the chunks T0's blobs encode (tier.gpu.codec).", [](const gpu::DeviceStats& s) { return s.t0_raw_bytes; }},
      {"kdn_gpu_t0_stored_bytes", "gauge", "Bytes of the blobs in T0 (tier.gpu.codec).", [](const gpu::DeviceStats& s) { return s.t0_stored_bytes; }},
      {"kdn_gpu_peer_mask", "gauge", "Bit j: the device can read device j's memory.", [](const gpu::DeviceStats& s) { return s.peer_mask; }},
  };
  for (const auto& m : per_dev) {
    metric(m.name, m.type, m.help);
    for (const gpu::DeviceStats& s : devs) o << m.name << "{device=\"" << s.info.ordinal << "\"} " << m.get(s) << '\n';
  }
}

}  // namespace

std::string prometheus_text(const DaemonCounters& d, const std::vector<NamespaceMetrics>& ns, const gpu::GpuService* gpu) {
  std::ostringstream o;
  auto metric = [&](const char* name, const char* type, const char* help) {
    o << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n';
  };
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
  using Get = uint64_t (*)(const Namespace&);
  struct Col { const char* name; const char* type; const char* help; Get get; };
  static const Col cols[] = {
      {"kdn_namespace_sessions", "gauge", "Open sessions of the namespace.", [](const Namespace& n) -> uint64_t { return n.sessions; }},
      {"kdn_lookups_total", "counter", "LOOKUP and LOOKUP_EACH requests.", [](const Namespace& n) { return n.store->counters().lookups; }},
      {"kdn_lookup_hit_chunks_total", "counter", "Chunks found by LOOKUP and LOOKUP_EACH.", [](const Namespace& n) { return n.store->counters().lookup_hit_chunks; }},
      {"kdn_lookup_miss_chunks_total", "counter", "Chunks missed by LOOKUP and LOOKUP_EACH.", [](const Namespace& n) { return n.store->counters().lookup_miss_chunks; }},
      {"kdn_leases_total", "counter", "LEASE and LEASE_EACH requests.", [](const Namespace& n) { return n.store->counters().leases; }},
      {"kdn_lease_hit_chunks_total", "counter", "Chunks leased by LEASE and LEASE_EACH.", [](const Namespace& n) { return n.store->counters().lease_hit_chunks; }},
      {"kdn_lease_miss_chunks_total", "counter", "Chunks missed by LEASE and LEASE_EACH.", [](const Namespace& n) { return n.store->counters().lease_miss_chunks; }},
      {"kdn_stored_chunks_total", "counter", "Chunks committed.", [](const Namespace& n) { return n.store->counters().stored_chunks; }},
      {"kdn_stored_bytes_total", "counter", "Bytes committed.", [](const Namespace& n) { return n.store->counters().stored_bytes; }},
      {"kdn_retrieved_chunks_total", "counter", "Chunks leased to readers.", [](const Namespace& n) { return n.store->counters().retrieved_chunks; }},
      {"kdn_retrieved_bytes_total", "counter", "Bytes leased to readers.", [](const Namespace& n) { return n.store->counters().retrieved_bytes; }},
      {"kdn_aborted_chunks_total", "counter", "Reserved chunks aborted (by the client, its exit or the reservation timeout).", [](const Namespace& n) { return n.store->counters().aborted_chunks; }},
      {"kdn_demoted_chunks_total", "counter", "Copies written down to a lower tier.", [](const Namespace& n) { return n.store->counters().demoted_chunks; }},
      {"kdn_promoted_chunks_total", "counter", "Copies brought up from a lower tier.", [](const Namespace& n) { return n.store->counters().promoted_chunks; }},
      {"kdn_transfer_errors_total", "counter", "Transfers a tier failed (the data stayed where it was).", [](const Namespace& n) { return n.store->counters().transfer_errors; }},
      {"kdn_evicted_chunks_total", "counter", "Copies evicted from a tier to make room.", [](const Namespace& n) { return n.store->counters().evicted_chunks; }},
      {"kdn_dropped_chunks_total", "counter", "Chunks that left the namespace.", [](const Namespace& n) { return n.store->counters().dropped_chunks; }},
      {"kdn_corrupt_chunks_total", "counter", "Copies found damaged and dropped, never served.", [](const Namespace& n) { return n.store->counters().corrupt_chunks; }},
      {"kdn_active_leases", "gauge", "Leases held.", [](const Namespace& n) { return n.store->active_leases(); }},
      {"kdn_open_reservations", "gauge", "Reservations not yet committed.", [](const Namespace& n) { return n.store->open_reservations(); }},
      {"kdn_expired_reservations_total", "counter", "Reservations aborted by the reservation timeout.", [](const Namespace& n) { return n.counters.expired_reservations; }},
      {"kdn_staging_bytes", "gauge", "Staging areas of the namespace's sessions.", [](const Namespace& n) { return n.staging_bytes; }},
      {"kdn_host_prefault_left_bytes", "gauge", "Host arena bytes still to be faulted in after start.", [](const Namespace& n) { return n.prefault_left.load(std::memory_order_relaxed); }},
  };
  for (const Col& c : cols) {
    metric(c.name, c.type, c.help);
    for (const NamespaceMetrics& n : ns) o << c.name << "{namespace=\"" << n.name << "\"} " << c.get(*n.ns) << '\n';
  }
  // The disk and remote tiers' own counters, for namespaces that have them.
  using DiskGet = uint64_t (*)(const Namespace&);
  struct DiskCol { const char* name; const char* type; const char* help; DiskGet get; bool remote = false; };
  static const DiskCol disk_cols[] = {
      {"kdn_disk_reads_total", "counter", "Chunk payloads read from the disk tier.", [](const Namespace& n) { return n.disk->counters().reads; }},
      {"kdn_disk_read_bytes_total", "counter", "Bytes read from the disk tier.", [](const Namespace& n) { return n.disk->counters().read_bytes; }},
      {"kdn_disk_writes_total", "counter", "Chunks written to the disk tier.", [](const Namespace& n) { return n.disk->counters().writes; }},
      {"kdn_disk_write_bytes_total", "counter", "Bytes written to the disk tier (headers included).", [](const Namespace& n) { return n.disk->counters().write_bytes; }},
      {"kdn_disk_raw_bytes_written_total", "counter", "Canonical bytes of the chunks written (codec ratio: raw / stored).", [](const Namespace& n) { return n.disk->counters().raw_bytes_written; }},
      {"kdn_disk_stored_bytes_written_total", "counter", "Stored bytes of the chunks written.", [](const Namespace& n) { return n.disk->counters().stored_bytes_written; }},
      {"kdn_disk_recovered_chunks", "gauge", "Chunks found on disk at start.", [](const Namespace& n) { return n.store->counters().recovered_chunks; }},
      {"kdn_disk_faults_io_total", "counter", "Disk I/O errors (EIO and others).", [](const Namespace& n) { return n.disk->counters().io_errors; }},
      {"kdn_disk_faults_no_space_total", "counter", "Disk writes refused with ENOSPC.", [](const Namespace& n) { return n.disk->counters().no_space; }},
      {"kdn_disk_faults_end_of_file_total", "counter", "Reads past the end of a slab file.", [](const Namespace& n) { return n.disk->counters().end_of_file; }},
      {"kdn_disk_faults_crc_total", "counter", "Disk chunks that failed their CRC32C.", [](const Namespace& n) { return n.disk->counters().crc_mismatch; }},
      {"kdn_disk_faults_decode_total", "counter", "Compressed disk chunks that did not decode.", [](const Namespace& n) { return n.disk->counters().decode_errors; }},
      {"kdn_remote_reads_total", "counter", "Values read from the remote tier (GET).", [](const Namespace& n) { return n.remote->counters().reads; }, true},
      {"kdn_remote_read_bytes_total", "counter", "Chunk bytes read from the remote tier (decoded).", [](const Namespace& n) { return n.remote->counters().read_bytes; }, true},
      {"kdn_remote_stored_bytes_read_total", "counter", "Payload bytes read from the remote tier (as stored: the codec's ratio is read_bytes / this).", [](const Namespace& n) { return n.remote->counters().stored_bytes_read; }, true},
      {"kdn_remote_writes_total", "counter", "Values written to the remote tier (SET).", [](const Namespace& n) { return n.remote->counters().writes; }, true},
      {"kdn_remote_write_bytes_total", "counter", "Chunk bytes written to the remote tier.", [](const Namespace& n) { return n.remote->counters().write_bytes; }, true},
      {"kdn_remote_stored_bytes_written_total", "counter", "Payload bytes written to the remote tier (as stored: the codec's ratio is write_bytes / this).", [](const Namespace& n) { return n.remote->counters().stored_bytes_written; }, true},
      {"kdn_remote_encoded_writes_total", "counter", "Values written encoded with remote_codec.", [](const Namespace& n) { return n.remote->counters().encoded_writes; }, true},
      {"kdn_remote_raw_writes_total", "counter", "Values written raw under a remote_codec (encoders busy, model unknown, no gain).", [](const Namespace& n) { return n.remote->counters().raw_writes; }, true},
      {"kdn_remote_probes_total", "counter", "Remote lookups on local misses (one pipelined EXISTS batch each).", [](const Namespace& n) { return n.store->counters().remote_probes; }, true},
      {"kdn_remote_probe_keys_total", "counter", "Keys those lookups asked about.", [](const Namespace& n) { return n.store->counters().remote_probe_keys; }, true},
      {"kdn_remote_found_chunks_total", "counter", "Chunks remote lookups found (other nodes' or earlier uploads).", [](const Namespace& n) { return n.store->counters().remote_found_chunks; }, true},
      {"kdn_remote_failed_probes_total", "counter", "Remote lookups that did not fully answer in time (what did not answer is a miss).", [](const Namespace& n) { return n.store->counters().remote_failed_probes; }, true},
      {"kdn_remote_uploads_total", "counter", "Chunks uploaded to the remote tier.", [](const Namespace& n) { return n.store->counters().uploaded_chunks; }, true},
      {"kdn_remote_failed_uploads_total", "counter", "Uploads that failed (the chunk stayed on this node alone).", [](const Namespace& n) { return n.store->counters().failed_uploads; }, true},
      {"kdn_remote_faults_missing_total", "counter", "Remote reads that found no value (evicted, deleted, flushed).", [](const Namespace& n) { return n.remote->counters().missing; }, true},
      {"kdn_remote_faults_foreign_total", "counter", "Remote values of another chunk, model or namespace, refused.", [](const Namespace& n) { return n.remote->counters().foreign; }, true},
      {"kdn_remote_faults_bad_length_total", "counter", "Remote values of the wrong length, refused unread.", [](const Namespace& n) { return n.remote->counters().bad_length; }, true},
      {"kdn_remote_faults_bad_header_total", "counter", "Remote values whose header failed its checks.", [](const Namespace& n) { return n.remote->counters().bad_header; }, true},
      {"kdn_remote_faults_crc_total", "counter", "Remote payloads that failed their CRC32C.", [](const Namespace& n) { return n.remote->counters().crc_mismatch; }, true},
      {"kdn_remote_faults_decode_total", "counter", "Remote KVC1 payloads that did not decode (or, lossless, to other bytes).", [](const Namespace& n) { return n.remote->counters().decode_errors; }, true},
      {"kdn_remote_faults_wrong_type_total", "counter", "Remote keys holding another type (WRONGTYPE).", [](const Namespace& n) { return n.remote->counters().wrong_type; }, true},
      {"kdn_remote_faults_no_space_total", "counter", "Remote writes refused with OOM (maxmemory).", [](const Namespace& n) { return n.remote->counters().no_space; }, true},
      {"kdn_remote_faults_timeout_total", "counter", "Remote requests unanswered by their deadline (tier.remote.timeout_ms).", [](const Namespace& n) { return n.remote->counters().timeouts; }, true},
      {"kdn_remote_faults_unavailable_total", "counter", "Remote requests failed by a node down, a lost connection or redirects.", [](const Namespace& n) { return n.remote->counters().unavailable; }, true},
      {"kdn_remote_faults_error_reply_total", "counter", "Remote requests answered with another error (CLUSTERDOWN, TRYAGAIN, ...).", [](const Namespace& n) { return n.remote->counters().error_replies; }, true},
  };
  for (const DiskCol& c : disk_cols) {
    metric(c.name, c.type, c.help);
    for (const NamespaceMetrics& n : ns)
      if (c.remote ? n.ns->remote != nullptr : n.ns->disk != nullptr)
        o << c.name << "{namespace=\"" << n.name << "\"} " << c.get(*n.ns) << '\n';
  }
  read_path_families(o, ns, metric);
  struct TierCol { const char* name; const char* help; bool capacity; bool bytes; };
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
      if (b < std::size(LatencyHistogram::kBoundsNs)) o << double(LatencyHistogram::kBoundsNs[b]) / 1e9;
      else o << "+Inf";
      o << "\"} " << cumulative << '\n';
    }
    o << "kdn_request_duration_seconds_sum{op=\"" << name << "\"} " << double(h.sum_ns) / 1e9 << '\n';
    o << "kdn_request_duration_seconds_count{op=\"" << name << "\"} " << h.count << '\n';
  }
  if (gpu) gpu_text(o, *gpu);
  return o.str();
}

Status write_prometheus_file(const std::string& path, const DaemonCounters& d,
                             const std::vector<NamespaceMetrics>& ns, std::string* error,
                             const gpu::GpuService* gpu) {
  return write_file_atomically(path, prometheus_text(d, ns, gpu), 0600, error);
}

}  // namespace kdn::sidecar
