// kdnd: the per-node KV-cache sidecar daemon.
//
//   kdnd                                   # embedded defaults, no config file needed
//   kdnd --config /etc/kdn/kdnd.toml       # the file, then the flags override it
//   kdnd --set tier.host.bytes=8G          # any key of the table (kdnd --help lists them)
//   kdnd --print-config                    # the effective configuration as TOML
//
// The configuration is built in one order: embedded defaults, the file, the flags in
// command-line order, then fill_defaults() and validate(). Every flag but --config and
// --print-config sets a key of the table in config.cc, so the flags cannot drift from it.
#include <kdn/sidecar/config.h>
#include <kdn/sidecar/daemon.h>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>

#include <sys/resource.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>

namespace {

using kdn::sidecar::Config;
using kdn::sidecar::ConfigKeyInfo;

// A short flag for a key. A switch (`value` set) takes no argument and sets the key to it.
struct Alias {
  const char* names;  // as CLI11 takes them
  const char* key;    // a row of the key table
  const char* value;  // for switches; null for flags that take one
};

constexpr Alias kAliases[] = {
    {"-s,--socket", "socket", nullptr},
    {"--host-arena-bytes", "tier.host.bytes", nullptr},
    {"--slab-bytes", "tier.host.slab_bytes", nullptr},
    {"--eviction", "tier.host.eviction", nullptr},
    {"--token", "token", nullptr},
    {"--max-sessions", "max_sessions", nullptr},
    {"--max-namespaces", "max_namespaces", nullptr},
    {"--spin-us", "spin_us", nullptr},
    {"--no-populate", "tier.host.populate", "false"},
    {"--no-hugepages", "tier.host.hugepages", "false"},
    {"--metrics-file", "metrics_file", nullptr},
    {"--log-level", "log_level", nullptr},
};

const ConfigKeyInfo& key_info(const char* key) {
  for (const ConfigKeyInfo& k : kdn::sidecar::config_keys())
    if (std::strcmp(k.key, key) == 0) return k;
  std::fprintf(stderr, "kdnd: alias of unknown key %s\n", key);  // our bug, caught by any run
  std::abort();
}

// What --help shows after a flag: "SIZE", "lru|s3fifo", ...
std::string value_label(const ConfigKeyInfo& k) {
  const std::string type = k.type;
  if (type == "size") return "SIZE";
  if (type == "u32") return "N";
  if (type == "bool") return "BOOL";
  if (type == "string") return "TEXT";
  if (type == "list of u32") return "N,N,...";
  return type;  // a list of choices
}

struct Flags {
  std::string config_file;
  bool print_config = false;
  std::map<const CLI::Option*, const Alias*> aliases;
  CLI::Option* set = nullptr;
};

std::string key_list_footer() {
  std::string out = "Configuration keys (in the file, or --set KEY=VALUE; sizes take K, M, G, T):\n";
  for (const ConfigKeyInfo& k : kdn::sidecar::config_keys()) {
    out += "  " + std::string(k.key) + " (" + k.type + ", default: " + k.default_text + ")\n";
    out += "      " + std::string(k.help) + "\n";
  }
  return out;
}

void add_flags(CLI::App& app, Flags& f) {
  app.add_option("-c,--config", f.config_file)
      ->type_name("FILE")
      ->description("TOML configuration file, read before the other flags (default: none)");
  app.add_flag("--print-config", f.print_config)->description("print the effective configuration as TOML and exit");
  f.set = app.add_option("--set")
              ->expected(1)
              ->take_all()
              ->type_name("KEY=VALUE")
              ->description("set any key listed below; repeatable");
  for (const Alias& a : kAliases) {
    const ConfigKeyInfo& k = key_info(a.key);
    CLI::Option* o = nullptr;
    if (a.value) {
      o = app.add_flag(a.names)->description("sets " + std::string(a.key) + " = " + a.value +
                                             " (default: " + k.default_text + "; " + k.help + ")");
    } else {
      o = app.add_option(a.names)->expected(1)->take_all()->type_name(value_label(k));
      o->description(std::string(a.key) + ": " + k.help + "; default: " + k.default_text);
    }
    f.aliases[o] = &a;
  }
  app.footer(key_list_footer());
}

// Sets one key from the command line; false after printing why.
bool set_key(Config& cfg, const std::string& key, const std::string& value, const std::string& origin) {
  std::string error;
  if (cfg.set(key, value, &error, origin.empty() ? nullptr : origin.c_str()).ok()) return true;
  std::fprintf(stderr, "kdnd: %s\n", error.c_str());
  return false;
}

// Applies --set and the aliases in the order they were given, so the last one wins.
bool apply_flags(const CLI::App& app, const Flags& f, Config& cfg) {
  std::map<const CLI::Option*, size_t> seen;  // occurrences of each option so far
  for (const CLI::Option* o : app.parse_order()) {
    const size_t i = seen[o]++;
    if (o == f.set) {
      const std::string& kv = o->results()[i];
      const size_t eq = kv.find('=');
      if (eq == std::string::npos) {
        std::fprintf(stderr, "kdnd: --set %s: expected KEY=VALUE\n", kv.c_str());
        return false;
      }
      if (!set_key(cfg, kv.substr(0, eq), kv.substr(eq + 1), "")) return false;
    } else if (auto it = f.aliases.find(o); it != f.aliases.end()) {
      const Alias& a = *it->second;
      const std::string value = a.value ? a.value : o->results()[i];
      const std::string origin = o->get_name() + (a.value ? "" : " " + value) + " (" + a.key + ")";
      if (!set_key(cfg, a.key, value, origin)) return false;
    }
  }
  return true;
}

// Every session holds descriptors (its socket, doorbell, memfds until mapped), and so do the
// tiers and the metrics endpoint: the usual soft limit of 1024 would make a busy node's new
// sessions fail with KDN_ERR_IO long before max_sessions. The hard limit is the operator's.
void raise_fd_limit() {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur >= lim.rlim_max) return;
  const rlim_t was = lim.rlim_cur;
  lim.rlim_cur = lim.rlim_max;
  if (setrlimit(RLIMIT_NOFILE, &lim) != 0) {
    spdlog::warn("cannot raise the open-file limit from {} to {}: {}", was, lim.rlim_max, std::strerror(errno));
    return;
  }
  spdlog::info("open-file limit raised from {} to {}", was, lim.rlim_max);
}

int run_daemon(const Config& cfg) {
  auto logger = spdlog::stderr_color_mt("kdnd");
  spdlog::set_default_logger(logger);
  spdlog::set_level(spdlog::level::from_str(cfg.log_level));
  raise_fd_limit();

  kdn::sidecar::DaemonFaults faults;
#if KDN_TEST_SEAMS
  // kdnd-test only (built with the tests): faults the multi-process tests inject.
  if (const char* n = std::getenv("KDN_TEST_GPU_FAIL_RETRIEVE"))
    faults.fail_gpu_retrieve = std::strtoull(n, nullptr, 10);
  if (const char* f = std::getenv("KDN_TEST_STALL_LEASE_FILE")) faults.stall_lease_file = f;
  if (const char* n = std::getenv("KDN_TEST_STALL_LEASE_MS")) faults.stall_lease_ms = std::strtoul(n, nullptr, 10);
#endif
  kdn::sidecar::Daemon daemon(cfg, faults);
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

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kdnd: per-node KV-cache sidecar"};
  Flags flags;
  add_flags(app, flags);
  try {  // CLI11 reports by exception; it stops here
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(e);  // --help
    std::fprintf(stderr, "kdnd: %s (kdnd --help lists the flags)\n", e.what());
    return 2;
  }

  Config cfg;
  std::string error;
  if (!flags.config_file.empty() && !cfg.load_toml(flags.config_file, &error).ok()) {
    std::fprintf(stderr, "kdnd: %s\n", error.c_str());
    return 2;
  }
  if (!apply_flags(app, flags, cfg)) return 2;
  cfg.fill_defaults();
  if (!cfg.validate(&error).ok()) {
    std::fprintf(stderr, "kdnd: %s\n", error.c_str());
    return 2;
  }
  if (flags.print_config) {
    std::fputs(cfg.to_toml().c_str(), stdout);
    return 0;
  }
  return run_daemon(cfg);
}
