// kdnd configuration: embedded defaults, overridden by a TOML file, overridden by flags.
//
// kdnd runs with no file at all. Every size accepts a suffix (K, M, G, T; powers of 1024).
#pragma once

#include <kdn/common/status.h>

#include <cstdint>
#include <string>

namespace kdn::sidecar {

struct Config {
  std::string socket_path;          // default: kdn default socket path (see kdn/kdn.h)
  uint64_t host_arena_bytes = 0;    // per namespace; 0 = min(4 GiB, 25% of RAM)
  uint64_t slab_bytes = 64ull << 20;
  bool populate = true;             // pre-fault arenas so the data path never page-faults
  bool hugepages = true;            // ask for transparent huge pages on the arenas
  std::string eviction = "lru";     // lru | s3fifo
  std::string token;                // shared secret clients must present ("" = none)
  bool allow_other_uids = false;    // accept clients of another uid (root is always accepted)
  uint32_t max_sessions = 256;
  uint32_t max_namespaces = 16;
  uint32_t spin_us = 200;           // busy-poll this long after the last request before sleeping
  uint32_t handshake_timeout_ms = 2000;
  std::string log_level = "info";   // trace debug info warn error off
  std::string metrics_file;         // if set, Prometheus text metrics are written here every second

  // Applies the embedded defaults that depend on the machine (RAM, $XDG_RUNTIME_DIR).
  void fill_defaults();
  // Reads a TOML file; unknown keys are an error (they are usually typos).
  Status load_toml(const std::string& path);
  // Rejects values that cannot work (e.g. arena smaller than one slab).
  Status validate() const;
  // The effective configuration as TOML (kdnd --print-config).
  std::string to_toml() const;
};

// Parses "64M", "4G", "1024" into bytes; false on junk or overflow.
bool parse_size(const std::string& s, uint64_t* out);

}  // namespace kdn::sidecar
