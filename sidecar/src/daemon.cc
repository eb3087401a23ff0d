// kdnd start-up, the metrics it writes, and the public Daemon (daemon_impl.h lists the rooms).
#include "daemon_impl.h"

#include "tier_factory.h"

#include <kdn/common/clock.h>
#include <kdn/common/files.h>
#include <kdn/ipc/doorbell.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>

#include <csignal>

namespace kdn::sidecar {
using namespace daemon_detail;
namespace {

// The socket's modes: private to kdnd's uid unless the configuration lets other uids or
// groups connect, when others may enter the directory (not list or write it) and connect.
ipc::ListenOptions listen_options(const Config& c) {
  const uint32_t self = ::geteuid();
  bool others = false;
  for (const NamespaceConfig& ns : c.namespaces) {
    others |= !ns.allow_gids.empty();
    for (uint32_t uid : ns.allow_uids) others |= uid != self;
  }
  if (c.allow_create_namespaces)
    for (uint32_t uid : c.create_namespace_uids) others |= uid != self && uid != 0;
  ipc::ListenOptions o;
  o.backlog = 256;
  o.dir_mode = others ? 0711 : 0700;
  o.socket_mode = others ? 0666 : 0600;
  return o;
}

}  // namespace

// ---- start-up ---------------------------------------------------------------------------------

Status DaemonImpl::start() {
  std::string error;
  Status valid = cfg_.validate(&error);
  if (!valid.ok()) {
    spdlog::error("{}", error.empty() ? valid.what() : error);
    return valid;
  }
  auto poller = ipc::EventPoller::create();
  if (!poller.ok()) return poller.status();
  poller_ = std::move(*poller);

  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGINT);
  sigaddset(&mask, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &mask, nullptr);
  signal(SIGPIPE, SIG_IGN);
  signal_fd_.reset(signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK));
  stop_fd_.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!signal_fd_ || !stop_fd_) return Status::from_errno("signalfd/eventfd", errno);

  auto gpu = gpu::GpuService::create(cfg_.gpu, faults_.fail_gpu_retrieve);
  if (!gpu.ok()) {
    spdlog::error("{}", gpu.status().what());
    return gpu.status();
  }
  gpu_ = std::move(*gpu);
  handler_.set_gpu(gpu_.get());
  if (gpu_->enabled()) {
    KDN_RETURN_IF_ERROR(poller_.add(gpu_->wake_fd(), tag(kGpuWake, 0)));
    spdlog::info("GPU tier on: {} device(s), T0 {} MiB each, host arenas {}pinned", gpu_->device_count(),
                 cfg_.gpu.bytes >> 20, cfg_.gpu.pin_host ? "" : "not ");
  } else {
    spdlog::info("GPU tier off: {}", gpu_->off_reason());
  }

  if (!cfg_.metrics_file.empty()) {
    if (Status st = check_private_dir(parent_dir(cfg_.metrics_file), "metrics directory", &error); !st.ok()) {
      spdlog::error("metrics_file = \"{}\": {}", cfg_.metrics_file, error);
      return st;
    }
  }
  // The socket first: a daemon that cannot listen says so before it spends seconds
  // pre-faulting arenas.
  std::string listen_error;
  auto l = ipc::uds_listen(cfg_.socket_path, listen_options(cfg_), &listen_error);
  if (!l.ok()) {
    spdlog::error("cannot listen: {}", listen_error.empty() ? l.status().what() : listen_error);
    return l.status();
  }
  listen_ = std::move(*l);
  if (!cfg_.metrics_listen.empty()) {
    std::string why;
    auto m = MetricsServer::start(cfg_.metrics_listen, &why);
    if (!m.ok()) {
      spdlog::error("{}", why.empty() ? m.status().what() : why);
      return m.status();
    }
    metrics_server_ = std::move(*m);
    KDN_RETURN_IF_ERROR(poller_.add(metrics_server_->wake_fd(), tag(kScrape, 0)));
    spdlog::info("metrics at http://{}:{}/metrics", metrics_server_->host(), metrics_server_->port());
  }
  std::vector<Prefaulter::Target> prefault;
  for (const NamespaceConfig& nc : cfg_.namespaces) {
    auto ns = open_namespace(nc.name, nc, true);
    if (!ns.ok()) return ns.status();
    if (cfg_.host.populate) {
      const ipc::SharedSegment& arena = (*ns)->host->arena();
      (*ns)->prefault_left.store(arena.size(), std::memory_order_relaxed);
      prefault.push_back({nc.name, arena.data(), arena.size(), &(*ns)->prefault_left});
    }
  }
  KDN_RETURN_IF_ERROR(poller_.add(listen_.get(), tag(kListen, 0)));
  KDN_RETURN_IF_ERROR(poller_.add(signal_fd_.get(), tag(kSignal, 0)));
  KDN_RETURN_IF_ERROR(poller_.add(stop_fd_.get(), tag(kStop, 0)));
  spdlog::info("kdnd listening on {} (protocol {}, {} namespace(s), host arena {} MiB each, eviction {})",
               cfg_.socket_path, KDN_PROTOCOL_VERSION, namespaces_.size(), cfg_.host.bytes >> 20, cfg_.host.eviction);
  prefaulter_.start(std::move(prefault));  // configured namespaces live as long as the daemon
  return OkStatus();
}

std::vector<NamespaceMetrics> DaemonImpl::metrics_namespaces() const {
  std::vector<NamespaceMetrics> ns;
  for (auto& [name, n] : namespaces_) ns.push_back({name, n.get()});
  return ns;
}

// METRICS as an admin session sees it: the whole page for an admin of every namespace; for a
// namespace's own admin, the series of the namespaces that name its uid and nothing
// daemon-wide (other tenants' traffic shows in those totals).
std::string DaemonImpl::metrics_page_for(const Session& s) const {
  if (s.node_admin) return prometheus_text(&counters_, metrics_namespaces(), gpu_.get());
  std::vector<NamespaceMetrics> ns;
  for (auto& [name, n] : namespaces_)
    if (administers(*n, s.uid)) ns.push_back({name, n.get()});
  return prometheus_text(nullptr, ns, nullptr);
}

void DaemonImpl::write_metrics() {
  last_metrics_ns_ = now_ns();
  std::string error;
  Status st = write_prometheus_file(cfg_.metrics_file, counters_, metrics_namespaces(), &error, gpu_.get());
  if (!st.ok() && error.empty()) error = st.what();
  if (error != metrics_error_) {  // a failure is logged once, and so is the recovery
    if (error.empty())
      spdlog::info("metrics file {} written again", cfg_.metrics_file);
    else
      spdlog::warn("metrics file: {}", error);
    metrics_error_ = std::move(error);
  }
}

Daemon::Daemon(Config config, DaemonFaults faults) : impl_(std::make_unique<DaemonImpl>(std::move(config), faults)) {}
Daemon::~Daemon() = default;
Status Daemon::start() { return impl_->start(); }
Status Daemon::run() { return impl_->run(); }
void Daemon::request_stop() { impl_->request_stop(); }

}  // namespace kdn::sidecar
