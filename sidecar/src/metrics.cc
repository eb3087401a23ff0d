#include "metrics.h"

#include <cstdio>
#include <sstream>

namespace kdn::sidecar {

std::string prometheus_text(const DaemonCounters& d, const std::vector<NamespaceMetrics>& ns) {
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
  metric("kdn_handshakes_refused_total", "counter", "Connections refused at the handshake.");
  o << "kdn_handshakes_refused_total " << d.handshakes_refused << '\n';
  struct Col { const char* name; const char* type; const char* help; uint64_t (*get)(const NamespaceMetrics&); };
  static const Col cols[] = {
      {"kdn_resident_chunks", "gauge", "Committed chunks in the host tier.", [](const NamespaceMetrics& n) { return n.store->resident_chunks(); }},
      {"kdn_resident_bytes", "gauge", "Bytes of committed chunks in the host tier.", [](const NamespaceMetrics& n) { return n.store->resident_bytes(); }},
      {"kdn_capacity_bytes", "gauge", "Host tier capacity.", [](const NamespaceMetrics& n) { return n.store->capacity_bytes(); }},
      {"kdn_lookups_total", "counter", "Lookups.", [](const NamespaceMetrics& n) { return n.store->counters().lookups; }},
      {"kdn_lookup_hit_chunks_total", "counter", "Chunks found by lookups.", [](const NamespaceMetrics& n) { return n.store->counters().lookup_hit_chunks; }},
      {"kdn_lookup_miss_chunks_total", "counter", "Chunks missed by lookups.", [](const NamespaceMetrics& n) { return n.store->counters().lookup_miss_chunks; }},
      {"kdn_stored_bytes_total", "counter", "Bytes committed.", [](const NamespaceMetrics& n) { return n.store->counters().stored_bytes; }},
      {"kdn_retrieved_bytes_total", "counter", "Bytes leased to readers.", [](const NamespaceMetrics& n) { return n.store->counters().retrieved_bytes; }},
      {"kdn_evicted_chunks_total", "counter", "Chunks evicted.", [](const NamespaceMetrics& n) { return n.store->counters().evicted_chunks; }},
      {"kdn_active_leases", "gauge", "Leases held.", [](const NamespaceMetrics& n) { return n.store->counters().active_leases; }},
      {"kdn_open_reservations", "gauge", "Reservations not yet committed.", [](const NamespaceMetrics& n) { return n.store->counters().open_reservations; }},
  };
  for (const Col& c : cols) {
    metric(c.name, c.type, c.help);
    for (const NamespaceMetrics& n : ns) o << c.name << "{namespace=\"" << n.name << "\",tier=\"host\"} " << c.get(n) << '\n';
  }
  return o.str();
}

Status write_prometheus_file(const std::string& path, const DaemonCounters& d,
                             const std::vector<NamespaceMetrics>& ns) {
  const std::string text = prometheus_text(d, ns);
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (!f) return Status::from_errno("open metrics file", errno);
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (std::fclose(f) != 0 || !ok) return Status(Code::kIo, "write metrics file");
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return Status::from_errno("rename metrics file", errno);
  return OkStatus();
}

}  // namespace kdn::sidecar
