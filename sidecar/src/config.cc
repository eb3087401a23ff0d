#include <kdn/sidecar/config.h>

#include <kdn/ipc/uds.h>
#include <toml++/toml.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace kdn::sidecar {
namespace {

uint64_t total_ram_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? uint64_t(pages) * uint64_t(page) : (8ull << 30);
}

template <class T>
bool read_int(const toml::table& t, const char* k, T* out) {
  if (auto v = t[k].value<int64_t>()) {
    if (*v < 0) return false;
    *out = static_cast<T>(*v);
  }
  return true;
}

bool read_size(const toml::table& t, const char* k, uint64_t* out) {
  if (auto v = t[k].value<int64_t>()) {
    if (*v < 0) return false;
    *out = uint64_t(*v);
    return true;
  }
  if (auto s = t[k].value<std::string>()) return parse_size(*s, out);
  return true;
}

}  // namespace

bool parse_size(const std::string& s, uint64_t* out) {
  if (s.empty()) return false;
  errno = 0;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (errno || end == s.c_str() || s[0] == '-') return false;
  std::string suf(end);
  int shift = 0;
  if (suf == "" || suf == "B") shift = 0;
  else if (suf == "K" || suf == "KiB" || suf == "k") shift = 10;
  else if (suf == "M" || suf == "MiB") shift = 20;
  else if (suf == "G" || suf == "GiB") shift = 30;
  else if (suf == "T" || suf == "TiB") shift = 40;
  else return false;
  if (shift && v > (~0ull >> shift)) return false;
  *out = uint64_t(v) << shift;
  return true;
}

void Config::fill_defaults() {
  if (socket_path.empty()) socket_path = ipc::default_socket_path();
  if (host_arena_bytes == 0) {
    const uint64_t quarter = total_ram_bytes() / 4;
    host_arena_bytes = std::min<uint64_t>(4ull << 30, quarter);
  }
}

Status Config::load_toml(const std::string& path) {
  toml::table t;
  try {  // toml++ reports syntax errors by exception; they stop here
    t = toml::parse_file(path);
  } catch (const toml::parse_error&) {
    return Status(Code::kInvalidArgument, "config: TOML syntax error");
  }
  static const char* kKnown[] = {"socket", "host_arena_bytes", "slab_bytes", "populate",
                                 "hugepages", "eviction", "token", "allow_other_uids",
                                 "max_sessions", "max_namespaces", "spin_us",
                                 "handshake_timeout_ms", "log_level", "metrics_file"};
  for (auto&& [k, v] : t) {
    bool known = false;
    for (const char* n : kKnown) known |= k.str() == n;
    if (!known) return Status(Code::kInvalidArgument, "config: unknown key");
  }
  if (auto v = t["socket"].value<std::string>()) socket_path = *v;
  if (!read_size(t, "host_arena_bytes", &host_arena_bytes) || !read_size(t, "slab_bytes", &slab_bytes))
    return Status(Code::kInvalidArgument, "config: bad size");
  populate = t["populate"].value_or(populate);
  hugepages = t["hugepages"].value_or(hugepages);
  eviction = t["eviction"].value_or(eviction);
  token = t["token"].value_or(token);
  allow_other_uids = t["allow_other_uids"].value_or(allow_other_uids);
  log_level = t["log_level"].value_or(log_level);
  metrics_file = t["metrics_file"].value_or(metrics_file);
  if (!read_int(t, "max_sessions", &max_sessions) || !read_int(t, "max_namespaces", &max_namespaces) ||
      !read_int(t, "spin_us", &spin_us) || !read_int(t, "handshake_timeout_ms", &handshake_timeout_ms))
    return Status(Code::kInvalidArgument, "config: negative number");
  return OkStatus();
}

Status Config::validate() const {
  if (slab_bytes < (1ull << 20)) return Status(Code::kInvalidArgument, "slab_bytes must be at least 1 MiB");
  if (host_arena_bytes < slab_bytes)
    return Status(Code::kInvalidArgument, "host_arena_bytes must hold at least one slab");
  if (eviction != "lru" && eviction != "s3fifo")
    return Status(Code::kInvalidArgument, "eviction must be lru or s3fifo");
  if (max_sessions == 0 || max_namespaces == 0)
    return Status(Code::kInvalidArgument, "max_sessions and max_namespaces must be positive");
  if (socket_path.empty() || socket_path.size() >= 108)
    return Status(Code::kInvalidArgument, "socket path empty or longer than 107 bytes");
  if (spin_us > 1000000) return Status(Code::kInvalidArgument, "spin_us must be at most 1 s");
  return OkStatus();
}

std::string Config::to_toml() const {
  toml::table t{{"socket", socket_path},
                {"host_arena_bytes", int64_t(host_arena_bytes)},
                {"slab_bytes", int64_t(slab_bytes)},
                {"populate", populate},
                {"hugepages", hugepages},
                {"eviction", eviction},
                {"token", token.empty() ? "" : "<set>"},
                {"allow_other_uids", allow_other_uids},
                {"max_sessions", int64_t(max_sessions)},
                {"max_namespaces", int64_t(max_namespaces)},
                {"spin_us", int64_t(spin_us)},
                {"handshake_timeout_ms", int64_t(handshake_timeout_ms)},
                {"log_level", log_level},
                {"metrics_file", metrics_file}};
  std::ostringstream os;
  os << t << "\n";
  return os.str();
}

}  // namespace kdn::sidecar
