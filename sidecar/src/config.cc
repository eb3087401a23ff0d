// kConfigKeys, the one list of kdnd's configuration keys, and the Config operations that are
// not about files: set(), fill_defaults(), validate(), to_toml() and the namespace tokens.
// The TOML loader is config_toml.cc; value conversions are config_values.cc.
#include <kdn/sidecar/config.h>

#include "config_table.h"
#include "metrics_server.h"
#include "redis_cluster.h"

#include <kdn/common/files.h>
#include <kdn/ipc/fd.h>
#include <kdn/ipc/protocol.h>
#include <kdn/ipc/uds.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <thread>

namespace kdn::sidecar {

using config_table::KeyDef;
using config_table::Section;
using config_table::UidList;

namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

// Every key kdnd knows. Bounds (min, max, choices) are checked by validate(), after the file
// and the flags, so a flag can still repair a value the file got wrong.
// clang-format off
constexpr KeyDef kConfigKeys[] = {
    // ---- the daemon
    {.key = "socket", .field = &Config::socket_path,
     .default_text = "$KDN_SOCKET, else $XDG_RUNTIME_DIR/kdn/kdnd.sock, else /tmp/kdn-$UID/kdnd.sock",
     .help = "the Unix socket that clients connect to (at most 107 bytes)", .computed = true},
    {.key = "log_level", .field = &Config::log_level, .default_text = "info",
     .help = "log verbosity (stderr)", .choices = "trace|debug|info|warn|error|off"},
    {.key = "metrics_file", .field = &Config::metrics_file, .default_text = "",
     .help = "Prometheus text metrics are rewritten here every second; empty: none"},
    {.key = "metrics_listen", .field = &Config::metrics_listen, .default_text = "",
     .help = "serve Prometheus metrics over HTTP at this loopback HOST:PORT (GET /metrics); empty: off"},
    {.key = "spin_us", .field = &Config::spin_us, .default_text = "200",
     .help = "busy-poll this long after the last request before sleeping; CPU for latency",
     .max = 1000000},
    {.key = "slice_us", .field = &Config::slice_us, .default_text = "200",
     .help = "one request's slice of work before other sessions get a turn", .min = 10,
     .max = 100000},
    {.key = "room_wait_ms", .field = &Config::room_wait_ms, .default_text = "1000",
     .help = "a RESERVE or LEASE that needs room a demotion in flight will free waits this long, "
             "then gets what fits", .max = 600000},
    {.key = "handshake_timeout_ms", .field = &Config::handshake_timeout_ms,
     .default_text = "2000", .help = "a connection that sends no hello in this time is closed",
     .min = 1},
    {.key = "max_pending_handshakes", .field = &Config::max_pending_handshakes,
     .default_text = "128",
     .help = "connections waiting to send their hello; more are refused at once (sessions "
             "have their own cap)",
     .min = 1},
    {.key = "max_pending_handshakes_per_uid", .field = &Config::max_pending_handshakes_per_uid,
     .default_text = "64",
     .help = "of those, connections of one uid; when all are taken, a uid holding fewer takes "
             "the oldest of the uid holding the most",
     .min = 1},
    {.key = "token", .field = &Config::token, .default_text = "",
     .help = "the secret clients present, in namespaces without token_file; empty: none",
     .secret = true},
    // ---- who may do what
    {.key = "admin_uids", .field = &Config::admin_uids, .default_text = "the daemon's uid, 0",
     .help = "uids that administer every namespace (list, evict, read every counter)",
     .computed = true},
    {.key = "allow_create_namespaces", .field = &Config::allow_create_namespaces,
     .default_text = "true", .help = "clients may ask for a namespace the file does not declare"},
    {.key = "create_namespace_uids", .field = &Config::create_namespace_uids,
     .default_text = "the daemon's uid, 0", .help = "uids that may create such a namespace",
     .computed = true},
    {.key = "namespace_grace_s", .field = &Config::namespace_grace_s, .default_text = "60",
     .help = "a client-created namespace without sessions is released, memory and all, after "
             "this long"},
    {.key = "max_namespaces", .field = &Config::max_namespaces, .default_text = "16",
     .help = "namespaces at once, declared and client-created; each has its own arena",
     .min = 1},
    // ---- limits
    {.key = "max_sessions", .field = &Config::max_sessions, .default_text = "256",
     .help = "connected clients", .min = 1},
    {.key = "max_sessions_per_uid", .field = &Config::max_sessions_per_uid,
     .default_text = "64", .help = "connected clients of one uid", .min = 1},
    {.key = "sessions_reserved_per_namespace", .field = &Config::sessions_reserved_per_namespace,
     .default_text = "16",
     .help = "sessions kept free for each namespace until it uses them (at most max_sessions / "
             "namespaces); 0: none"},
    {.key = "max_leases", .field = &Config::max_leases, .default_text = "65536",
     .help = "distinct chunks one session holds leases on", .min = 1},
    {.key = "max_leases_per_uid", .field = &Config::max_leases_per_uid, .default_text = "262144",
     .help = "distinct chunks one uid's sessions hold leased together (~100 bytes of kdnd's memory each)",
     .min = 1},
    {.key = "max_leases_total", .field = &Config::max_leases_total, .default_text = "1048576",
     .help = "(session, chunk) leases all sessions hold together: ~100 MiB of kdnd's memory at most",
     .min = 1},
    {.key = "max_lease_bytes", .field = &Config::max_lease_bytes, .default_text = "8G",
     .help = "bytes of the distinct chunks one session holds leased; leased chunks cannot be evicted, so "
             "one session cannot pin a whole arena larger than this (a 64K-token llama3-8b prompt is 8G)",
     .min = 1},
    {.key = "max_lease_count", .field = &Config::max_lease_count, .default_text = "65535",
     .help = "leases one session holds on one chunk", .min = 1},
    {.key = "max_reservations", .field = &Config::max_reservations, .default_text = "4096",
     .help = "open reservations of one session", .min = 1},
    {.key = "reservation_timeout_ms", .field = &Config::reservation_timeout_ms,
     .default_text = "30000", .help = "an uncommitted reservation is aborted after this long",
     .min = 1},
    {.key = "max_in_flight", .field = &Config::max_in_flight, .default_text = "256",
     .help = "requests of one session served at once", .min = 1, .max = 4096},
    {.key = "max_models", .field = &Config::max_models, .default_text = "64",
     .help = "models one session registers", .min = 1},
    {.key = "max_models_total", .field = &Config::max_models_total, .default_text = "4096",
     .help = "models registered by all sessions together", .min = 1},
    {.key = "max_models_per_uid", .field = &Config::max_models_per_uid, .default_text = "1024",
     .help = "distinct models one uid's sessions hold together", .min = 1},
    {.key = "models_reserved_per_namespace", .field = &Config::models_reserved_per_namespace,
     .default_text = "64",
     .help = "model slots kept free for each namespace until it uses them (at most max_models_total / "
             "namespaces); 0: none"},
    {.key = "staging_bytes", .field = &Config::staging_bytes, .default_text = "256M",
     .help = "not applied: a hello always names its staging size (libkdn asks 256M unless told); "
             "kept so existing files load, at most max_staging_bytes"},
    {.key = "max_staging_bytes", .field = &Config::max_staging_bytes, .default_text = "4G",
     .help = "the largest staging area one session may ask for"},
    {.key = "max_staging_bytes_per_uid", .field = &Config::max_staging_bytes_per_uid, .default_text = "16G",
     .help = "staging areas of one uid's sessions together (at least max_staging_bytes)"},
    {.key = "max_staging_bytes_per_namespace", .field = &Config::max_staging_bytes_per_namespace,
     .default_text = "32G", .help = "staging areas of one namespace's sessions together (at least max_staging_bytes)"},
    // ---- [tier.host]
    {.key = "tier.host.bytes", .field = &HostTierConfig::bytes,
     .default_text = "min(4G, RAM/4)",
     .help = "host arena of each namespace; memory in use is at most this times the namespaces",
     .computed = true, .formerly = "host_arena_bytes"},
    {.key = "tier.host.slab_bytes", .field = &HostTierConfig::slab_bytes, .default_text = "64M",
     .help = "allocator slab; a chunk larger than a slab spans several", .min = kMiB},
    {.key = "tier.host.eviction", .field = &HostTierConfig::eviction, .default_text = "lru",
     .help = "which unleased chunk goes when the arena is full", .choices = "lru|s3fifo"},
    {.key = "tier.host.populate", .field = &HostTierConfig::populate, .default_text = "true",
     .help = "pre-fault the declared namespaces' arenas at start, so the data path takes no "
             "page faults"},
    {.key = "tier.host.hugepages", .field = &HostTierConfig::hugepages, .default_text = "true",
     .help = "ask for transparent huge pages on the arenas"},
    {.key = "tier.host.copy_threads", .field = &HostTierConfig::copy_threads,
     .default_text = "min(4, CPUs)", .help = "workers copying staging areas into the arena",
     .computed = true},
    {.key = "tier.host.max_demotions", .field = &HostTierConfig::max_demotions, .default_text = "32",
     .help = "demotions to the disk tier in flight at once to make room in the arena", .min = 1,
     .max = 65536},
    // ---- [tier.remote]
    {.key = "tier.remote.seeds", .field = &RemoteTierConfig::seeds, .default_text = "",
     .help = "numeric host:port of Redis Cluster nodes (any of them), or of one standalone "
             "Redis/Valkey server; empty: no remote tier"},
    {.key = "tier.remote.mode", .field = &RemoteTierConfig::mode, .default_text = "cluster",
     .help = "cluster: a Redis Cluster (slot map, redirects); standalone: one server",
     .choices = "cluster|standalone"},
    {.key = "tier.remote.username", .field = &RemoteTierConfig::username, .default_text = "",
     .help = "ACL user kdnd authenticates as; empty: the default user"},
    {.key = "tier.remote.password_file", .field = &RemoteTierConfig::password_file, .default_text = "",
     .help = "file whose first line is the AUTH password, not readable by others; empty: no AUTH"},
    {.key = "tier.remote.pool", .field = &RemoteTierConfig::pool, .default_text = "2",
     .help = "connections to each master, per namespace", .min = 1, .max = 64},
    {.key = "tier.remote.timeout_ms", .field = &RemoteTierConfig::timeout_ms, .default_text = "500",
     .help = "deadline of every remote request: an engine never waits longer for the remote tier "
             "(a late answer is a miss)",
     .min = 10, .max = 60000},
    {.key = "tier.remote.policy", .field = &RemoteTierConfig::policy, .default_text = "write_through",
     .help = "write_through: chunks are uploaded as they are committed (other nodes find them at "
             "once); write_back: as they leave this node's memory",
     .choices = "write_through|write_back"},
    {.key = "tier.remote.bytes", .field = &RemoteTierConfig::bytes, .default_text = "64G",
     .help = "chunks in the store this node keeps track of, per namespace (the store's own "
             "maxmemory bounds what it holds)", .min = kMiB},
    {.key = "tier.remote.read_ahead", .field = &RemoteTierConfig::read_ahead, .default_text = "64",
     .help = "chunks of a prefix fetched from the remote tier ahead of a LEASE, or after a LOOKUP "
             "that found them there", .max = 4096},
    {.key = "tier.remote.max_in_flight", .field = &RemoteTierConfig::max_in_flight, .default_text = "256",
     .help = "remote reads and writes in flight per namespace", .min = 1, .max = 65536},
    // ---- [tier.gpu]
    {.key = "tier.gpu.enable", .field = &GpuTierConfig::enable, .default_text = "auto",
     .help = "auto: the GPU tier is on when a CUDA device answers; on: kdnd refuses to start "
             "without one; off: GPU requests are answered KDN_ERR_UNSUPPORTED",
     .choices = "auto|on|off"},
    {.key = "tier.gpu.bytes", .field = &GpuTierConfig::bytes, .default_text = "0",
     .help = "T0 bytes on each device (chunks kept in GPU memory); 0: no T0, engines are served "
             "from the pinned host tier"},
    {.key = "tier.gpu.pin_host", .field = &GpuTierConfig::pin_host, .default_text = "true",
     .help = "page-lock every namespace's host arena when a GPU is present, so copies between "
             "it and devices run at DMA speed"},
    {.key = "tier.gpu.slice_bytes", .field = &GpuTierConfig::slice_bytes, .default_text = "8M",
     .help = "bulk copies are cut into slices of at most this on a low-priority stream, so an "
             "engine's kernels interleave with them", .min = 64 * 1024, .max = 1ull << 30},
    {.key = "tier.gpu.max_registrations", .field = &GpuTierConfig::max_registrations,
     .default_text = "16", .help = "GPU memory registrations one session holds at once",
     .min = 1, .max = 1024},
    {.key = "tier.gpu.staging_bytes", .field = &GpuTierConfig::staging_bytes, .default_text = "128M",
     .help = "per device: the bounce buffer of chunks served without T0 and the metadata of "
             "requests in flight (a chunk larger than half of it is not served by the GPU tier)",
     .min = kMiB, .max = 1ull << 36},
    {.key = "tier.gpu.codec", .field = &GpuTierConfig::codec, .default_text = "none",
     .help = "what T0 holds: none (chunks as the engine wrote them) or KVC1 blobs decoded on the "
             "device at retrieve, lossless (bit-exact) or lossy int8, kivi4 (about 4.5x more "
             "chunks in T0; applies to every namespace)",
     .choices = "none|lossless|int8|kivi4"},
    // ---- [tier.disk]
    {.key = "tier.disk.dirs", .field = &DiskTierConfig::dirs, .default_text = "",
     .help = "one directory per NVMe device, each on a file system with O_DIRECT; empty: no disk "
             "tier"},
    {.key = "tier.disk.bytes", .field = &DiskTierConfig::bytes, .default_text = "16G",
     .help = "slab file of each directory, per declared namespace (preallocated and written once "
             "at creation)", .min = kMiB},
    {.key = "tier.disk.slab_bytes", .field = &DiskTierConfig::slab_bytes, .default_text = "64M",
     .help = "slab of the slab files; a chunk larger than a slab spans several", .min = kMiB},
    {.key = "tier.disk.queue_depth", .field = &DiskTierConfig::queue_depth, .default_text = "32",
     .help = "chunk reads and writes in flight per directory and namespace (io_uring queue depth; "
             "a chunk's 4 KiB header write and slab table writes have as many slots again)",
     .min = 1, .max = 4096},
    {.key = "tier.disk.policy", .field = &DiskTierConfig::policy, .default_text = "write_back",
     .help = "write_back: chunks go to disk when the arena evicts them; write_through: also as "
             "they are committed (a COMMIT completes once on disk)",
     .choices = "write_back|write_through"},
    {.key = "tier.disk.eviction", .field = &DiskTierConfig::eviction, .default_text = "lru",
     .help = "which chunk leaves the disk tier when it is full", .choices = "lru|s3fifo"},
    {.key = "tier.disk.fsync", .field = &DiskTierConfig::fsync, .default_text = "none",
     .help = "none: writes survive a kdnd crash; batch: fdatasync after writes, one in flight per "
             "file, so they survive a power loss too", .choices = "none|batch"},
    {.key = "tier.disk.register_buffers", .field = &DiskTierConfig::register_buffers,
     .default_text = "true",
     .help = "register the arena with io_uring as fixed buffers (needs RLIMIT_MEMLOCK or "
             "CAP_IPC_LOCK; without, kdnd says so once and runs unregistered)"},
    {.key = "tier.disk.workers", .field = &DiskTierConfig::workers, .default_text = "min(4, CPUs)",
     .help = "threads encoding and decoding compressed disk chunks (checksums run on the event loop, "
             "in slices)", .computed = true, .max = 256},
    {.key = "tier.disk.read_ahead", .field = &DiskTierConfig::read_ahead, .default_text = "16",
     .help = "chunks of a prefix promoted ahead of a LEASE or LOOKUP that meets the disk tier",
     .max = 65536},
    {.key = "tier.disk.prefetch_max_chunks", .field = &DiskTierConfig::prefetch_max_chunks,
     .default_text = "4096", .help = "chunks one PREFETCH (kdn_prefetch) may promote", .min = 1,
     .max = 65536},
    {.key = "tier.disk.encode_queue", .field = &DiskTierConfig::encode_queue, .default_text = "8",
     .help = "chunks waiting for an encoder beyond which demotions are written raw (and "
             "re-encoded when the disk is idle)", .max = 65536},
    {.key = "tier.disk.reencode", .field = &DiskTierConfig::reencode, .default_text = "true",
     .help = "re-encode chunks written raw while the disk tier is idle"},
    {.key = "tier.disk.write_error", .field = &DiskTierConfig::write_error, .default_text = "drop",
     .help = "a demotion that fails drops the arena copy it made room for (drop) or keeps it "
             "(keep)", .choices = "drop|keep"},
    {.key = "tier.disk.flush_on_stop", .field = &DiskTierConfig::flush_on_stop,
     .default_text = "true",
     .help = "on SIGTERM, write every chunk held only in the arena to disk before exiting"},
    // ---- [namespace.NAME]
    {.key = "namespace.*.allow_uids", .field = &NamespaceConfig::allow_uids,
     .default_text = "the daemon's uid", .help = "uids that may connect (root always may)",
     .computed = true, .formerly = "allow_other_uids"},
    {.key = "namespace.*.allow_gids", .field = &NamespaceConfig::allow_gids, .default_text = "",
     .help = "a client whose primary or supplementary gid is listed may connect"},
    {.key = "namespace.*.admin_uids", .field = &NamespaceConfig::admin_uids, .default_text = "",
     .help = "uids that administer this namespace, besides admin_uids"},
    {.key = "namespace.*.token_file", .field = &NamespaceConfig::token_file, .default_text = "",
     .help = "file whose first line is this namespace's token, not readable by others; empty: "
             "the top-level token"},
    {.key = "namespace.*.max_bytes", .field = &NamespaceConfig::max_bytes, .default_text = "0",
     .help = "host arena of this namespace; 0: tier.host.bytes"},
    {.key = "namespace.*.max_sessions", .field = &NamespaceConfig::max_sessions,
     .default_text = "0", .help = "sessions in this namespace; 0: only max_sessions applies"},
    {.key = "namespace.*.disk_codec", .field = &NamespaceConfig::disk_codec, .default_text = "none",
     .help = "chunks at rest in the disk tier: none, lossless (bit-exact) or lossy int8, kivi4",
     .choices = "none|lossless|int8|kivi4"},
    {.key = "namespace.*.disk_bytes", .field = &NamespaceConfig::disk_bytes, .default_text = "0",
     .help = "this namespace's slab file per disk directory; 0: tier.disk.bytes"},
    {.key = "namespace.*.remote_codec", .field = &NamespaceConfig::remote_codec, .default_text = "none",
     .help = "chunks sent to the remote tier: none, lossless (bit-exact) or lossy int8, kivi4; "
             "decoded where they are read",
     .choices = "none|lossless|int8|kivi4"},
};
// clang-format on

uint64_t total_ram_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? uint64_t(pages) * uint64_t(page) : (8ull << 30);
}

// ---- set()

// A dotted key split into its row and, for namespace keys, the namespace.
struct ResolvedKey {
  const KeyDef* def = nullptr;
  std::string ns;
};

std::string unknown_key(std::string_view key, Section section, std::string_view name, std::string_view ns) {
  return "unknown key '" + std::string(key) + "'" + config_table::did_you_mean(section, name, ns);
}

bool resolve_namespace_key(std::string_view key, ResolvedKey* out, std::string* why) {
  const std::string_view rest = key.substr(std::string_view("namespace.").size());
  const size_t dot = rest.rfind('.');  // names may hold dots; key names do not
  if (dot == std::string_view::npos) {
    *why = "unknown key '" + std::string(key) + "' (namespace keys are namespace.NAME.KEY)";
    return false;
  }
  out->ns = std::string(rest.substr(0, dot));
  if (!valid_namespace_name(out->ns)) {
    *why = "'" + out->ns + "': " + config_table::kNamespaceNameRule;
    return false;
  }
  const std::string_view name = rest.substr(dot + 1);
  out->def = config_table::find_key(Section::kNamespace, name);
  if (!out->def) *why = unknown_key(key, Section::kNamespace, name, out->ns);
  return out->def != nullptr;
}

bool resolve_tier_key(std::string_view key, ResolvedKey* out, std::string* why) {
  const std::string_view rest = key.substr(std::string_view("tier.").size());
  const size_t dot = rest.find('.');
  const std::string_view tier = rest.substr(0, dot);
  const std::optional<Section> found = config_table::tier_section(tier);
  if (!found) {
    *why = "unknown tier '" + std::string(tier) + "' (this kdnd has: " + config_table::kTierNames + ")";
    return false;
  }
  const Section section = *found;
  const std::string_view name = dot == std::string_view::npos ? "" : rest.substr(dot + 1);
  out->def = config_table::find_key(section, name);
  if (!out->def) *why = unknown_key(key, section, name, "");
  return out->def != nullptr;
}

bool resolve_key(std::string_view key, ResolvedKey* out, std::string* why) {
  if (key.starts_with("namespace.")) return resolve_namespace_key(key, out, why);
  if (key.starts_with("tier.")) return resolve_tier_key(key, out, why);
  out->def = config_table::find_key(Section::kDaemon, key);
  if (!out->def) *why = unknown_key(key, Section::kDaemon, key, "");
  return out->def != nullptr;
}

// ---- validate(): each check returns what is wrong, naming the key and its value, or "".

std::string bounds_text(const KeyDef& k) {
  const bool size = std::string_view(config_table::type_name(k)) == "size";
  auto number = [&](uint64_t v) { return size ? config_table::size_text(v) : std::to_string(v); };
  const bool has_max = k.max != std::numeric_limits<uint64_t>::max();
  if (k.min > 0 && has_max) return "between " + number(k.min) + " and " + number(k.max);
  if (has_max) return "at most " + number(k.max);
  if (k.min > 0) return "at least " + number(k.min);
  return "";
}

// "lru|s3fifo" -> "lru or s3fifo"; longer lists get commas.
std::string choices_text(std::string_view choices) {
  const size_t last = choices.rfind('|');
  if (last == std::string_view::npos) return std::string(choices);
  std::string out;
  for (const char ch : choices.substr(0, last)) out += ch == '|' ? std::string(", ") : std::string(1, ch);
  return out + " or " + std::string(choices.substr(last + 1));
}

bool is_choice(std::string_view choices, std::string_view v) {
  for (size_t start = 0;;) {
    const size_t bar = choices.find('|', start);
    if (choices.substr(start, bar - start) == v) return true;
    if (bar == std::string_view::npos) return false;
    start = bar + 1;
  }
}

// " ([namespace.a] on line 7)" for a namespace from a file, else "".
std::string origin_of(const NamespaceConfig* ns) {
  if (!ns || ns->line <= 0) return "";
  return " ([namespace." + ns->name + "] on line " + std::to_string(ns->line) + ")";
}

std::string bound_problem(const KeyDef& k, const Config& c, const NamespaceConfig* ns) {
  std::string why;
  config_table::with_value(k, c, ns, [&](const auto& v) {
    using T = std::remove_cvref_t<decltype(v)>;
    if constexpr (std::is_same_v<T, uint32_t> || std::is_same_v<T, uint64_t>) {
      if (v < k.min || v > k.max) why = "must be " + bounds_text(k);
    } else if constexpr (std::is_same_v<T, std::string>) {
      if (k.choices && !is_choice(k.choices, v)) why = "must be " + choices_text(k.choices);
    }
  });
  if (why.empty()) return "";
  return config_table::dotted_key(k, ns ? ns->name : "") + " = " + config_table::value_text(k, c, ns) + origin_of(ns) +
         ": " + why;
}

std::string check_bounds(const Config& c) {
  for (const KeyDef& k : config_table::keys()) {
    if (config_table::section_of(k) != Section::kNamespace) {
      if (std::string p = bound_problem(k, c, nullptr); !p.empty()) return p;
      continue;
    }
    for (const NamespaceConfig& ns : c.namespaces)
      if (std::string p = bound_problem(k, c, &ns); !p.empty()) return p;
  }
  return "";
}

// "tier.host.bytes = "1M"", for messages about two keys.
std::string key_and_value(const config_table::Field& member, const Config& c, const NamespaceConfig* ns = nullptr) {
  const KeyDef& k = config_table::row_of(member);
  return config_table::dotted_key(k, ns ? ns->name : "") + " = " + config_table::value_text(k, c, ns) + origin_of(ns);
}

std::string check_arenas(const Config& c) {
  if (c.host.bytes < c.host.slab_bytes)
    return key_and_value(&HostTierConfig::bytes, c) + ": smaller than " +
           key_and_value(&HostTierConfig::slab_bytes, c) + " (an arena holds whole slabs)";
  for (const NamespaceConfig& ns : c.namespaces)
    if (ns.max_bytes != 0 && ns.max_bytes < c.host.slab_bytes)
      return key_and_value(&NamespaceConfig::max_bytes, c, &ns) + ": smaller than " +
             key_and_value(&HostTierConfig::slab_bytes, c) + " (an arena holds whole slabs)";
  return "";
}

std::string check_disk(const Config& c) {
  const DiskTierConfig& d = c.disk;
  if (d.dirs.empty()) return "";
  if (d.slab_bytes % 4096 != 0)
    return key_and_value(&DiskTierConfig::slab_bytes, c) + ": not a multiple of 4K (direct I/O)";
  if (d.bytes < d.slab_bytes)
    return key_and_value(&DiskTierConfig::bytes, c) + ": smaller than " +
           key_and_value(&DiskTierConfig::slab_bytes, c) + " (a slab file holds whole slabs)";
  for (size_t i = 0; i < d.dirs.size(); ++i) {
    if (d.dirs[i].empty() || d.dirs[i][0] != '/')
      return key_and_value(&DiskTierConfig::dirs, c) + ": '" + d.dirs[i] + "' is not an absolute path";
    for (size_t j = 0; j < i; ++j)
      if (d.dirs[j] == d.dirs[i])
        return key_and_value(&DiskTierConfig::dirs, c) + ": '" + d.dirs[i] + "' is listed twice";
  }
  for (const NamespaceConfig& ns : c.namespaces)
    if (ns.disk_bytes != 0 && ns.disk_bytes < d.slab_bytes)
      return key_and_value(&NamespaceConfig::disk_bytes, c, &ns) + ": smaller than " +
             key_and_value(&DiskTierConfig::slab_bytes, c);
  return "";
}

std::string check_remote(const Config& c) {
  const RemoteTierConfig& r = c.remote;
  if (r.seeds.empty()) return "";
  for (const std::string& seed : r.seeds) {
    const auto a = parse_address(seed);
    if (!a || a->port == 0)
      return key_and_value(&RemoteTierConfig::seeds, c) + ": '" + seed +
             "' is not host:port with a numeric address (hostnames are not resolved)";
  }
  if (r.mode == "standalone" && r.seeds.size() != 1)
    return key_and_value(&RemoteTierConfig::seeds, c) + ": standalone mode takes exactly one server";
  if (!r.password_file.empty() && r.password_file[0] != '/')
    return key_and_value(&RemoteTierConfig::password_file, c) + ": not an absolute path";
  return "";
}

std::string check_daemon(const Config& c) {
  constexpr size_t kMaxSocketPath = 107;  // sockaddr_un::sun_path, less the NUL
  if (c.socket_path.empty()) return key_and_value(&Config::socket_path, c) + ": empty";
  if (c.socket_path.size() > kMaxSocketPath)
    return key_and_value(&Config::socket_path, c) + ": " + std::to_string(c.socket_path.size()) +
           " bytes; a Unix socket path holds at most 107";
  if (c.token.size() >= ipc::kTokenBytes)
    return key_and_value(&Config::token, c) + ": " + std::to_string(c.token.size()) + " bytes; a token holds at most " +
           std::to_string(ipc::kTokenBytes - 1);
  if (c.staging_bytes > c.max_staging_bytes)
    return key_and_value(&Config::staging_bytes, c) + ": larger than " + key_and_value(&Config::max_staging_bytes, c);
  // A budget below one session's largest area would refuse every such session.
  for (uint64_t Config::*budget : {&Config::max_staging_bytes_per_uid, &Config::max_staging_bytes_per_namespace})
    if (c.*budget < c.max_staging_bytes)
      return key_and_value(budget, c) + ": smaller than " + key_and_value(&Config::max_staging_bytes, c);
  if (!c.metrics_listen.empty()) {
    std::string host, why;
    uint16_t port = 0;
    if (!parse_loopback_listen(c.metrics_listen, &host, &port, &why)) return "metrics_listen = " + why;
  }
  return "";
}

std::string check_namespaces(const Config& c) {
  std::string names;
  for (size_t i = 0; i < c.namespaces.size(); ++i) {
    const NamespaceConfig& ns = c.namespaces[i];
    if (!valid_namespace_name(ns.name))
      return "namespace '" + ns.name + "'" + origin_of(&ns) + ": " + config_table::kNamespaceNameRule;
    for (size_t j = 0; j < i; ++j)
      if (c.namespaces[j].name == ns.name) return "namespace '" + ns.name + "' is declared twice";
    if (ns.max_sessions > c.max_sessions)
      return key_and_value(&NamespaceConfig::max_sessions, c, &ns) + ": larger than " +
             key_and_value(&Config::max_sessions, c);
    names += (i ? ", " : "") + ns.name;
  }
  if (c.namespaces.size() > c.max_namespaces)
    return key_and_value(&Config::max_namespaces, c) + ": " + std::to_string(c.namespaces.size()) +
           " namespaces are declared (" + names + ")";
  return "";
}

// ---- to_toml()

// A namespace name as a TOML key: bare when it can be, quoted when it holds a dot.
std::string toml_key(const std::string& name) {
  return name.find('.') == std::string::npos ? name : config_table::toml_text(name);
}

void append_section(std::string* out, Section section, const Config& c, const NamespaceConfig* ns) {
  const std::span<const KeyDef> keys = config_table::keys();
  for (size_t i = 0; i < keys.size(); ++i) {
    const KeyDef& k = keys[i];
    if (config_table::section_of(k) != section) continue;
    *out += "# " + std::string(config_keys()[i].help) + "\n";
    *out += std::string(config_table::local_name(k)) + " = " + config_table::value_text(k, c, ns) + "\n";
  }
}

// ---- the key list for --help and docs

// config_keys() rows point into these strings, built once from the table.
struct KeyInfoTable {
  std::vector<std::array<std::string, 3>> text;  // type, default, help
  std::vector<ConfigKeyInfo> rows;

  KeyInfoTable() {
    for (const KeyDef& k : config_table::keys()) text.push_back(describe(k));
    for (size_t i = 0; i < text.size(); ++i) {
      const KeyDef& k = config_table::keys()[i];
      rows.push_back({k.key, text[i][0].c_str(), text[i][1].c_str(), text[i][2].c_str()});
    }
  }

  static std::array<std::string, 3> describe(const KeyDef& k) {
    std::string type = k.choices ? k.choices : config_table::type_name(k);
    std::string def = k.default_text;
    if (def.empty()) def = type == "string" ? "\"\"" : "[]";
    std::string help = k.help;
    if (const std::string b = bounds_text(k); !b.empty()) help += " (" + b + ")";
    return {std::move(type), std::move(def), std::move(help)};
  }
};

}  // namespace

namespace config_table {
std::span<const KeyDef> keys() { return kConfigKeys; }
}  // namespace config_table

const std::vector<ConfigKeyInfo>& config_keys() {
  static const KeyInfoTable table;
  return table.rows;
}

bool parse_size(const std::string& s, uint64_t* out) {
  if (s.empty()) return false;
  errno = 0;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (errno || end == s.c_str() || s[0] == '-') return false;
  std::string suf(end);
  int shift = 0;
  if (suf == "" || suf == "B")
    shift = 0;
  else if (suf == "K" || suf == "KiB" || suf == "k")
    shift = 10;
  else if (suf == "M" || suf == "MiB")
    shift = 20;
  else if (suf == "G" || suf == "GiB")
    shift = 30;
  else if (suf == "T" || suf == "TiB")
    shift = 40;
  else
    return false;
  if (shift && v > (~0ull >> shift)) return false;
  *out = uint64_t(v) << shift;
  return true;
}

bool valid_namespace_name(const std::string& name) {
  if (name.empty() || name.size() > 63 || name[0] == '.') return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
           c == '-';
  });
}

Status Config::set(const std::string& key, const std::string& value, std::string* error, const char* origin) {
  const std::string where = origin ? origin : "--set " + key + "=" + value;
  std::string why;
  ResolvedKey r;
  if (!resolve_key(key, &r, &why)) return config_table::config_error(error, where + ": " + why, "config: unknown key");
  // Parse into a fresh namespace first: a bad value must not declare one.
  NamespaceConfig fresh;
  NamespaceConfig* ns = nullptr;
  if (!r.ns.empty()) ns = find_namespace(r.ns) ? &config_table::namespace_entry(*this, r.ns, 0) : &fresh;
  if (!config_table::assign_text(*r.def, value, *this, ns, &why))
    return config_table::config_error(error, where + ": " + why, "config: bad value");
  if (ns == &fresh) {
    fresh.name = r.ns;
    namespaces.push_back(std::move(fresh));
  }
  return OkStatus();
}

void Config::fill_defaults() {
  if (socket_path.empty()) socket_path = ipc::default_socket_path();
  if (host.bytes == 0) host.bytes = std::min<uint64_t>(4ull << 30, total_ram_bytes() / 4);
  if (host.copy_threads == 0) host.copy_threads = std::clamp(std::thread::hardware_concurrency(), 1u, 4u);
  if (disk.workers == 0) disk.workers = std::clamp(std::thread::hardware_concurrency(), 1u, 4u);
  const uint32_t me = getuid();
  const UidList me_and_root = me == 0 ? UidList{0} : UidList{me, 0};
  if (admin_uids.empty()) admin_uids = me_and_root;
  if (create_namespace_uids.empty()) create_namespace_uids = me_and_root;
  config_table::namespace_entry(*this, "default", 0);
  for (NamespaceConfig& ns : namespaces)
    if (ns.allow_uids.empty()) ns.allow_uids = {me};
}

Status Config::validate(std::string* error) const {
  for (auto check : {check_bounds, check_arenas, check_disk, check_remote, check_daemon, check_namespaces}) {
    if (std::string problem = check(*this); !problem.empty())
      return config_table::config_error(error, std::move(problem), "config: invalid configuration");
  }
  return OkStatus();
}

std::string Config::to_toml() const {
  std::string out = "# kdnd configuration (every key: kdnd --help)\n";
  append_section(&out, Section::kDaemon, *this, nullptr);
  out += "\n[tier.host]\n";
  append_section(&out, Section::kTierHost, *this, nullptr);
  out += "\n[tier.disk]\n";
  append_section(&out, Section::kTierDisk, *this, nullptr);
  out += "\n[tier.remote]\n";
  append_section(&out, Section::kTierRemote, *this, nullptr);
  out += "\n[tier.gpu]\n";
  append_section(&out, Section::kTierGpu, *this, nullptr);
  for (const NamespaceConfig& ns : namespaces) {
    out += "\n[namespace." + toml_key(ns.name) + "]\n";
    append_section(&out, Section::kNamespace, *this, &ns);
  }
  return out;
}

const NamespaceConfig* Config::find_namespace(const std::string& name) const {
  for (const NamespaceConfig& ns : namespaces)
    if (ns.name == name) return &ns;
  return nullptr;
}

namespace {

// The first line of an open file, without surrounding blanks; false and errno on a failed read.
bool read_first_line(int fd, std::string* line) {
  constexpr size_t kMaxRead = 4096;  // a token is 63 bytes; more is not a token file
  char buf[kMaxRead];
  size_t got = 0;
  while (got < kMaxRead) {
    const ssize_t n = ::read(fd, buf + got, kMaxRead - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return false;
    if (n == 0 || std::memchr(buf + got, '\n', size_t(n))) {
      got += size_t(n);
      break;
    }
    got += size_t(n);
  }
  std::string_view text(buf, got);
  text = text.substr(0, text.find('\n'));
  const size_t b = text.find_first_not_of(" \t\r");
  *line = b == std::string_view::npos ? "" : std::string(text.substr(b, text.find_last_not_of(" \t\r") - b + 1));
  return true;
}

}  // namespace

Status load_namespace_token(const NamespaceConfig& ns, const Config& c, std::string* token, std::string* error) {
  if (ns.token_file.empty()) {
    *token = c.token;
    return OkStatus();
  }
  const std::string what = "namespace." + ns.name + ".token_file = " + config_table::toml_text(ns.token_file);
  return read_secret_file(ns.token_file, what, ipc::kTokenBytes - 1, token, error);
}

namespace {

// Opens a secret file under a checked descriptor of its directory, refusing a symlink (and
// not blocking on a FIFO), and checks the file itself: a secret another user can replace is
// no secret. `*error` gets a sentence after `what`.
Result<ipc::UniqueFd> open_secret_file(const std::string& path, const std::string& what, std::string* error) {
  std::string why;
  Result<int> dir = open_private_dir(parent_dir(path), "its directory", &why);
  if (!dir.ok()) {
    if (error) *error = what + ": " + why;
    return dir.status();
  }
  const ipc::UniqueFd dir_fd(*dir);
  const std::string name = path.substr(path.rfind('/') + 1);
  ipc::UniqueFd fd(::openat(dir_fd.get(), name.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NOFOLLOW | O_NONBLOCK));
  if (!fd) {
    const int err = errno;
    if (error)
      *error = what + ": cannot read: " + (err == ELOOP ? "it is a symlink; name the file itself" : std::strerror(err));
    return Status::from_errno("config: cannot read a secret file", err);
  }
  if (Status st = check_private_file_fd(fd.get(), "the file", &why); !st.ok()) {
    if (error) *error = what + ": " + why;
    return st;
  }
  return fd;
}

}  // namespace

Status read_secret_file(const std::string& path, const std::string& what, size_t max_bytes, std::string* secret,
                        std::string* error) {
  Result<ipc::UniqueFd> opened = open_secret_file(path, what, error);
  if (!opened.ok()) return opened.status();
  const ipc::UniqueFd& fd = *opened;
  struct stat st {};
  std::string line;
  if (::fstat(fd.get(), &st) != 0 || !read_first_line(fd.get(), &line)) {
    const int err = errno;
    if (error) *error = what + ": cannot read: " + std::strerror(err);
    return Status::from_errno("config: cannot read a secret file", err);
  }
  char mode[8];
  std::snprintf(mode, sizeof mode, "%04o", unsigned(st.st_mode & 07777));
  if (st.st_mode & (S_IROTH | S_IWOTH))
    return config_table::config_error(error,
                                      what + ": mode " + mode + " lets others read or write it; chmod o-rw the file",
                                      "config: secret file open to others");
  if (line.empty())
    return config_table::config_error(error, what + ": its first line is empty", "config: empty secret");
  if (line.size() > max_bytes)
    return config_table::config_error(
        error,
        what + ": its first line is " + std::to_string(line.size()) + " bytes; at most " + std::to_string(max_bytes),
        "config: secret too long");
  *secret = std::move(line);
  return OkStatus();
}

}  // namespace kdn::sidecar
