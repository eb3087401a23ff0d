// kdnd: the per-node KV-cache sidecar daemon.
//
//   kdnd                              # embedded defaults, no config file needed
//   kdnd --config /etc/kdn/kdnd.toml  # file, then flags override it
//   kdnd --print-config               # the effective configuration
#include <kdn/sidecar/config.h>
#include <kdn/sidecar/daemon.h>

#include <CLI/CLI.hpp>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <string>

int main(int argc, char** argv) {
  using kdn::sidecar::Config;
  Config cfg;
  std::string config_file, arena, slab;
  bool print_config = false;
  bool no_populate = false, no_hugepages = false;

  CLI::App app{"kdnd: per-node KV-cache sidecar"};
  app.add_option("-c,--config", config_file, "TOML configuration file")->check(CLI::ExistingFile);
  app.add_option("-s,--socket", cfg.socket_path, "Unix socket path (default: $KDN_SOCKET, "
                 "$XDG_RUNTIME_DIR/kdn/kdnd.sock or /tmp/kdn-$UID/kdnd.sock)");
  app.add_option("--host-arena-bytes", arena, "host tier size per namespace, e.g. 4G (default: min(4 GiB, RAM/4))");
  app.add_option("--slab-bytes", slab, "allocator slab size (default 64M)");
  app.add_option("--eviction", cfg.eviction, "eviction policy: lru or s3fifo")->check(CLI::IsMember({"lru", "s3fifo"}));
  app.add_option("--token", cfg.token, "shared secret clients must present");
  app.add_flag("--allow-other-uids", cfg.allow_other_uids, "accept clients running as another user");
  app.add_option("--max-sessions", cfg.max_sessions, "maximum connected clients");
  app.add_option("--max-namespaces", cfg.max_namespaces, "maximum namespaces (tenants)");
  app.add_option("--spin-us", cfg.spin_us, "busy-poll time after the last request before sleeping");
  app.add_flag("--no-populate", no_populate, "do not pre-fault the default namespace's arena");
  app.add_flag("--no-hugepages", no_hugepages, "do not ask for transparent huge pages");
  app.add_option("--metrics-file", cfg.metrics_file, "write Prometheus text metrics here every second");
  app.add_option("--log-level", cfg.log_level, "trace, debug, info, warn, error or off");
  app.add_flag("--print-config", print_config, "print the effective configuration and exit");
  CLI11_PARSE(app, argc, argv);

  // File first, then flags: re-parse so flags given on the command line win.
  if (!config_file.empty()) {
    Config from_file;
    kdn::Status st = from_file.load_toml(config_file);
    if (!st.ok()) {
      std::fprintf(stderr, "kdnd: %s: %s\n", config_file.c_str(), st.what());
      return 2;
    }
    Config flags = cfg;
    cfg = from_file;
    if (app.count("--socket")) cfg.socket_path = flags.socket_path;
    if (app.count("--eviction")) cfg.eviction = flags.eviction;
    if (app.count("--token")) cfg.token = flags.token;
    if (app.count("--allow-other-uids")) cfg.allow_other_uids = flags.allow_other_uids;
    if (app.count("--max-sessions")) cfg.max_sessions = flags.max_sessions;
    if (app.count("--max-namespaces")) cfg.max_namespaces = flags.max_namespaces;
    if (app.count("--spin-us")) cfg.spin_us = flags.spin_us;
    if (app.count("--metrics-file")) cfg.metrics_file = flags.metrics_file;
    if (app.count("--log-level")) cfg.log_level = flags.log_level;
  }
  if (!arena.empty() && !kdn::sidecar::parse_size(arena, &cfg.host_arena_bytes)) {
    std::fprintf(stderr, "kdnd: bad --host-arena-bytes '%s'\n", arena.c_str());
    return 2;
  }
  if (!slab.empty() && !kdn::sidecar::parse_size(slab, &cfg.slab_bytes)) {
    std::fprintf(stderr, "kdnd: bad --slab-bytes '%s'\n", slab.c_str());
    return 2;
  }
  if (no_populate) cfg.populate = false;
  if (no_hugepages) cfg.hugepages = false;
  cfg.fill_defaults();
  if (kdn::Status st = cfg.validate(); !st.ok()) {
    std::fprintf(stderr, "kdnd: invalid configuration: %s\n", st.what());
    return 2;
  }
  if (print_config) {
    std::fputs(cfg.to_toml().c_str(), stdout);
    return 0;
  }

  auto logger = spdlog::stderr_color_mt("kdnd");
  spdlog::set_default_logger(logger);
  spdlog::set_level(spdlog::level::from_str(cfg.log_level));

  kdn::sidecar::Daemon daemon(cfg);
  if (kdn::Status st = daemon.start(); !st.ok()) {
    spdlog::error("cannot start: {}{}{}", st.what(), st.sys_errno() ? ": " : "",
                  st.sys_errno() ? std::strerror(st.sys_errno()) : "");
    return 1;
  }
  if (kdn::Status st = daemon.run(); !st.ok()) {
    spdlog::error("stopped on error: {}", st.what());
    return 1;
  }
  spdlog::info("kdnd stopped");
  return 0;
}
