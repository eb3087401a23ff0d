// Prometheus text exposition of kdnd's counters (written to a file that node_exporter's
// textfile collector, or `kdnctl stats --prometheus`, picks up).
#pragma once

#include "request_handler.h"
#include "session.h"

#include <string>
#include <vector>

namespace kdn::sidecar {

struct NamespaceMetrics {
  std::string name;
  const Namespace* ns;
};

// The families of the namespaces `ns`; `d` (may be null: a page scoped to those namespaces)
// adds the daemon-wide families, and `gpu` (may be null) the GPU tier's kdn_gpu_* families.
std::string prometheus_text(const DaemonCounters* d, const std::vector<NamespaceMetrics>& ns,
                            const gpu::GpuService* gpu = nullptr);
// Writes the file whole (a temporary created O_EXCL | O_NOFOLLOW, mode 0600, then renamed);
// its directory must be one only kdnd's user can write (checked at start).
Status write_prometheus_file(const std::string& path, const DaemonCounters& d, const std::vector<NamespaceMetrics>& ns,
                             std::string* error, const gpu::GpuService* gpu = nullptr);

}  // namespace kdn::sidecar
