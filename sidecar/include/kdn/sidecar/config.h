// kdnd configuration: embedded defaults, overridden by a TOML file, overridden by flags.
//
// kdnd runs with no file at all. Every key lives in one table (config.cc, kConfigKeys): its
// TOML name, section, type, default, help text and where it lands in Config. The TOML
// loader, the command-line flags (`--set KEY=VALUE` for any key, plus short aliases such as
// `--host-arena-bytes`), `kdnd --print-config` and docs/operations.md all read that table.
//
// Layout of a file:
//
//   socket = "/run/kdn/kdnd.sock"        # top-level keys: the daemon and per-session limits
//   max_sessions = 256
//   [tier.host]                          # one section per tier: sizes, eviction, workers
//   bytes = "8G"
//   eviction = "s3fifo"
//   [tier.disk]
//   dirs = ["/nvme0/kdn", "/nvme1/kdn"]
//   [tier.remote]
//   seeds = ["10.0.0.5:7000", "10.0.0.6:7000"]
//   [namespace.team-a]                   # one section per configured namespace (tenant)
//   allow_uids = [1001, 1002]
//   token_file = "/etc/kdn/team-a.token"
//   max_bytes = "2G"
//
// Every error names the key, the value and the line ("kdnd.toml:7: tier.host.bytes = "4Q":
// not a size (a number with K, M, G or T)"). Unknown keys and unknown sections are errors:
// they are usually typos. Sizes take K/M/G/T suffixes (powers of 1024).
#pragma once

#include <kdn/common/status.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace kdn::sidecar {

// The host tier (T1): one memfd arena per namespace, cut into slabs.
struct HostTierConfig {
  uint64_t bytes = 0;  // arena per namespace; 0 = min(4 GiB, 25% of RAM)
  uint64_t slab_bytes = 64ull << 20;
  std::string eviction = "lru";  // lru | s3fifo
  bool populate = true;          // pre-fault the configured namespaces' arenas at start
  bool hugepages = true;         // madvise(MADV_HUGEPAGE) on arenas
  uint32_t copy_threads = 0;     // workers copying staging into the arena; 0 = min(4, CPUs)
  uint32_t max_demotions = 32;   // demotions to the disk tier in flight at once, making room
};

// The disk tier (T2): one slab file per directory (device) and configured namespace, read and
// written with io_uring. No directories: no disk tier. docs/disk-format.md has the bytes.
struct DiskTierConfig {
  std::vector<std::string> dirs;  // one per device; chunks are striped over them
  uint64_t bytes = 16ull << 30;   // slab file of each directory, per namespace
  uint64_t slab_bytes = 64ull << 20;
  uint32_t queue_depth = 32;            // io_uring requests in flight per directory
  std::string policy = "write_back";    // write_back | write_through
  std::string eviction = "lru";         // lru | s3fifo
  std::string fsync = "none";           // none | batch
  bool register_buffers = true;         // the arena as io_uring fixed buffers
  uint32_t workers = 0;                 // checksum and codec threads; 0 = min(4, CPUs)
  uint32_t read_ahead = 16;             // chunks promoted ahead of a lease or lookup
  uint32_t prefetch_max_chunks = 4096;  // chunks one PREFETCH may promote
  uint32_t encode_queue = 8;            // chunks waiting for an encoder before demotions go raw
  bool reencode = true;                 // re-encode raw chunks when the disk is idle
  std::string write_error = "drop";     // drop | keep: the host copy a failed demotion made room for
  bool flush_on_stop = true;            // SIGTERM writes every host-only chunk down first
};

// The remote tier (T3): a Redis Cluster or a standalone Redis/Valkey server the operator runs,
// shared by the kdnd of every node (docs/remote.md). No seeds: no remote tier.
// [tier.gpu]: T0, the GPU tier (docs/gpu.md).
struct GpuTierConfig {
  std::string enable = "auto";            // auto (on when a GPU answers) | on (refuse to start without) | off
  uint64_t bytes = 0;                     // T0 bytes per device; 0: no T0, engines served from pinned T1
  bool pin_host = true;                   // page-lock every namespace's host arena when a GPU is present
  uint64_t slice_bytes = 8ull << 20;      // bulk copies are cut into slices of at most this
  uint32_t max_registrations = 16;        // GPU_REGISTER registrations one session holds at once
  uint64_t staging_bytes = 128ull << 20;  // per device: a chunk bounce buffer and the request metadata
  std::string codec = "none";             // none | lossless | int8 | kivi4: what T0 holds (KVC1 blobs but for none)
};

struct RemoteTierConfig {
  std::vector<std::string> seeds;        // numeric "host:port"; cluster: any nodes; standalone: the server
  std::string mode = "cluster";          // cluster | standalone
  std::string username;                  // ACL user for AUTH; "": the default user
  std::string password_file;             // first line: the AUTH password; "": no AUTH
  uint32_t pool = 2;                     // connections per master
  uint32_t timeout_ms = 500;             // every request's deadline: no engine waits longer on T3
  std::string policy = "write_through";  // write_through | write_back
  uint64_t bytes = 64ull << 30;          // chunks this node keeps track of in the store, per namespace
  uint32_t read_ahead = 64;              // chunks promoted from T3 ahead of a LEASE or after a LOOKUP
  uint32_t max_in_flight = 256;          // GETs and SETs in flight per namespace
};

// A namespace (tenant) declared in the file. Namespaces not declared here exist only when an
// allowed client asks to create one (see Config::create_namespace_uids).
struct NamespaceConfig {
  std::string name;
  std::vector<uint32_t> allow_uids;   // empty: the daemon's uid (root is always allowed)
  std::vector<uint32_t> allow_gids;   // a client whose primary or supplementary gid is listed
  std::vector<uint32_t> admin_uids;   // may LIST/EVICT here and read every counter
  std::string token_file;             // file holding this namespace's token; "" = Config::token
  uint64_t max_bytes = 0;             // host arena of this namespace; 0 = tier.host.bytes
  uint32_t max_sessions = 0;          // 0 = no per-namespace cap beyond Config::max_sessions
  std::string disk_codec = "none";    // none | lossless | int8 | kivi4: chunks at rest in T2
  uint64_t disk_bytes = 0;            // slab file per disk directory; 0 = tier.disk.bytes
  std::string remote_codec = "none";  // none | lossless | int8 | kivi4: chunks sent to T3
  int line = 0;                       // where the section starts (for messages); 0 = built in
};

struct Config {
  // ---- the daemon
  std::string socket_path;         // default: kdn default socket path (see kdn/kdn.h)
  std::string log_level = "info";  // trace debug info warn error off
  std::string metrics_file;        // if set, Prometheus text metrics are written here every second
  std::string metrics_listen;      // if set, a loopback HOST:PORT serving GET /metrics
  uint32_t spin_us = 200;          // busy-poll this long after the last request before sleeping
  uint32_t slice_us = 200;         // one request's slice of work before others get a turn
  uint32_t room_wait_ms = 1000;    // a RESERVE or LEASE waits this long for room in a full tier
  uint32_t handshake_timeout_ms = 2000;
  uint32_t max_pending_handshakes = 128;         // connections accepted, hello not yet read
  uint32_t max_pending_handshakes_per_uid = 64;  // of those, from one uid (a burst of engines)
  std::string token;                             // shared secret of namespaces without token_file ("" = none)

  // ---- who may do what
  std::vector<uint32_t> admin_uids;             // admin of every namespace; empty = daemon uid + root
  bool allow_create_namespaces = true;          // may clients ask for a namespace not configured?
  std::vector<uint32_t> create_namespace_uids;  // who may; empty = daemon uid + root
  uint32_t namespace_grace_s = 60;              // a client-created namespace without sessions is
                                                // released (with its memory) after this long
  uint32_t max_namespaces = 16;

  // ---- limits (KDN_ERR_LIMIT beyond them)
  uint32_t max_sessions = 256;
  uint32_t max_sessions_per_uid = 64;
  uint32_t sessions_reserved_per_namespace = 16;           // guaranteed to each namespace (capped by
                                                           // max_sessions / namespaces)
  uint32_t max_leases = 65536;                             // distinct chunks one session holds leases on
  uint32_t max_lease_count = 65535;                        // repeated leases of one chunk by one session
  uint64_t max_lease_bytes = 8ull << 30;                   // bytes of the distinct chunks one session holds leased
  uint32_t max_leases_per_uid = 262144;                    // distinct chunks one uid's sessions hold leased together
  uint32_t max_leases_total = 1048576;                     // (session, chunk) leases all sessions hold together
  uint32_t max_reservations = 4096;                        // open reservations of one session
  uint32_t reservation_timeout_ms = 30000;                 // an uncommitted reservation is aborted after this
  uint32_t max_in_flight = 256;                            // requests of one session being served at once
  uint32_t max_models = 64;                                // models one session registers
  uint32_t max_models_total = 4096;                        // models registered by all sessions together
  uint32_t max_models_per_uid = 1024;                      // distinct models one uid's sessions hold together
  uint32_t models_reserved_per_namespace = 64;             // guaranteed to each namespace (capped by
                                                           // max_models_total / namespaces)
  uint64_t staging_bytes = 256ull << 20;                   // staging area of a session that asks for the default
  uint64_t max_staging_bytes = 4ull << 30;                 // the most one session may ask for
  uint64_t max_staging_bytes_per_uid = 16ull << 30;        // one uid's sessions together
  uint64_t max_staging_bytes_per_namespace = 32ull << 30;  // one namespace's sessions together

  // ---- tiers and namespaces
  HostTierConfig host;
  DiskTierConfig disk;
  RemoteTierConfig remote;
  GpuTierConfig gpu;
  std::vector<NamespaceConfig> namespaces;  // in file order; "default" is added if absent

  // Applies the embedded defaults that depend on the machine (RAM, uid, $XDG_RUNTIME_DIR)
  // and adds the "default" namespace when the file declares none of that name.
  void fill_defaults();
  // Reads a TOML file over the current values. On failure returns a non-ok Status and, if
  // `error` is not null, a message naming the file, the line, the key and the value.
  Status load_toml(const std::string& path, std::string* error = nullptr);
  // Sets one key from text ("tier.host.bytes", "4G"), as `--set` does: bools take
  // true/false/yes/no/1/0, lists are comma-separated. "namespace.NAME.KEY" declares NAME if
  // it is not yet. Errors name `origin`, default "--set KEY=VALUE"; the value is left as it
  // was.
  Status set(const std::string& key, const std::string& value, std::string* error = nullptr,
             const char* origin = nullptr);
  // Rejects values that cannot work together (an arena smaller than one slab, ...), naming
  // the key.
  Status validate(std::string* error = nullptr) const;
  // The effective configuration as TOML (kdnd --print-config); the token is shown as "<set>".
  std::string to_toml() const;
  // The namespace configured under `name`, or null.
  const NamespaceConfig* find_namespace(const std::string& name) const;
};

// Parses "64M", "4G", "1024" into bytes; false on junk or overflow.
bool parse_size(const std::string& s, uint64_t* out);

// A namespace name: 1 to 63 bytes of A-Z a-z 0-9 . _ -, not starting with '.'.
bool valid_namespace_name(const std::string& name);

// The token clients of `ns` must present: the first line of ns.token_file without surrounding
// blanks when the file is set, else c.token ("" = none). The file must not be readable or
// writable by others (mode & 006): a token anyone can read is no secret. An unreadable file,
// an empty token or one over 63 bytes is an error naming the file; `error` gets the message.
Status load_namespace_token(const NamespaceConfig& ns, const Config& c, std::string* token,
                            std::string* error = nullptr);
// The first line of a secret file (a token, a password) without surrounding blanks, at most
// max_bytes. The file must not be readable or writable by others, nor writable by its group;
// it must be a regular file (not a symlink) of kdnd's uid or root with one link, in a directory
// of kdnd's uid or root that no one else can write (common/files.h). `what` names the key and
// value in messages ("tier.remote.password_file = \"...\"").
Status read_secret_file(const std::string& path, const std::string& what, size_t max_bytes, std::string* secret,
                        std::string* error = nullptr);

// One row of the key table, for flags, help and docs: the dotted key ("tier.host.bytes";
// namespace keys as "namespace.*.max_bytes"), its type ("string", "bool", "u32", "size",
// "list of u32", "list of strings", or the accepted values: "lru|s3fifo"), its default as --help shows it, and
// its help with the bounds validate() applies. Rows are in table order and live forever.
struct ConfigKeyInfo {
  const char* key;
  const char* type;
  const char* default_text;
  const char* help;
};
const std::vector<ConfigKeyInfo>& config_keys();

}  // namespace kdn::sidecar
