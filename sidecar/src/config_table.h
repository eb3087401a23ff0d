// The key table behind Config: one row per configuration key (kConfigKeys in config.cc) and
// what the TOML loader, Config::set, Config::to_toml, Config::validate and config_keys()
// share to read and write a key's value. Private to the sidecar.
//
// A row names its value by a member pointer, so a key's type is the C++ type it points at
// and cannot disagree with the struct:
//
//   std::string -> string    bool -> bool    uint32_t -> u32
//   uint64_t    -> size (bytes; "64M" and friends)    UidList -> list of u32
//   PathList    -> list of strings
#pragma once

#include <kdn/sidecar/config.h>

#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

namespace kdn::sidecar::config_table {

using UidList = std::vector<uint32_t>;
using PathList = std::vector<std::string>;

// Where a key lives in a file: at the top, in [tier.host], [tier.disk], [tier.remote], [tier.gpu], or in every
// [namespace.NAME].
enum class Section { kDaemon, kTierHost, kTierDisk, kTierRemote, kTierGpu, kNamespace };

// The member a key reads and writes.
using Field =
    std::variant<std::string Config::*, bool Config::*, uint32_t Config::*, uint64_t Config::*, UidList Config::*,
                 std::string HostTierConfig::*, bool HostTierConfig::*, uint32_t HostTierConfig::*,
                 uint64_t HostTierConfig::*, std::string DiskTierConfig::*, bool DiskTierConfig::*,
                 uint32_t DiskTierConfig::*, uint64_t DiskTierConfig::*, PathList DiskTierConfig::*,
                 std::string RemoteTierConfig::*, uint32_t RemoteTierConfig::*, uint64_t RemoteTierConfig::*,
                 PathList RemoteTierConfig::*, std::string GpuTierConfig::*, bool GpuTierConfig::*,
                 uint32_t GpuTierConfig::*, uint64_t GpuTierConfig::*, std::string NamespaceConfig::*,
                 UidList NamespaceConfig::*, uint32_t NamespaceConfig::*, uint64_t NamespaceConfig::*>;

// One key. `default_text` is the default as `--set` takes it or, for a `computed` key, how
// fill_defaults() picks it (the field then starts empty). `min`, `max` and `choices` ("lru|s3fifo")
// bound what validate() accepts; `formerly` is an older name, for "did you mean" hints; a
// `secret` value is printed as "<set>" and never echoed in a message.
struct KeyDef {
  const char* key;  // dotted: "max_sessions", "tier.host.bytes", "namespace.*.max_bytes"
  Field field;
  const char* default_text;
  const char* help;
  bool computed = false;
  uint64_t min = 0;
  uint64_t max = std::numeric_limits<uint64_t>::max();
  const char* choices = nullptr;
  const char* formerly = nullptr;
  bool secret = false;
};

// Every row, in the order --print-config and --help show them.
std::span<const KeyDef> keys();

Section section_of(const KeyDef& k);
// The key's name inside its section: "bytes" for "tier.host.bytes".
std::string_view local_name(const KeyDef& k);
// The row of `name` in `section`, or null.
const KeyDef* find_key(Section section, std::string_view name);
// The dotted key as a user writes it: "namespace.team-a.max_bytes" for namespace `ns`.
std::string dotted_key(const KeyDef& k, std::string_view ns);
// The row whose member is `member` (for messages of checks across keys). It must exist.
const KeyDef& row_of(const Field& member);
// " (did you mean 'tier.host.bytes'?)" when a key's name or former name is within two edits
// of `name`, else "". Keys of `section` win ties; `ns` fills in a namespace key.
std::string did_you_mean(Section section, std::string_view name, std::string_view ns);

// "string", "bool", "u32", "size", "list of u32" or "list of strings".
const char* type_name(const KeyDef& k);

template <class M>
struct MemberTraits;
template <class S, class T>
struct MemberTraits<T S::*> {
  using Owner = S;
  using Type = T;
};

// Calls fn(value) with a reference to the value `k` names: in `c`, in `c.host`, or in `*ns`
// for namespace keys (`ns` must then be non-null). Const in, const reference out.
template <class C, class N, class Fn>
void with_value(const KeyDef& k, C& c, N* ns, Fn&& fn) {
  std::visit(
      [&](auto member) {
        using Owner = typename MemberTraits<decltype(member)>::Owner;
        if constexpr (std::is_same_v<Owner, Config>)
          fn(c.*member);
        else if constexpr (std::is_same_v<Owner, HostTierConfig>)
          fn(c.host.*member);
        else if constexpr (std::is_same_v<Owner, DiskTierConfig>)
          fn(c.disk.*member);
        else if constexpr (std::is_same_v<Owner, RemoteTierConfig>)
          fn(c.remote.*member);
        else if constexpr (std::is_same_v<Owner, GpuTierConfig>)
          fn(c.gpu.*member);
        else
          fn(ns->*member);
      },
      k.field);
}

// Text from the command line into a value of each key type; false and `why` on bad text.
bool parse_text(std::string_view s, std::string* out, std::string* why);
bool parse_text(std::string_view s, bool* out, std::string* why);
bool parse_text(std::string_view s, uint32_t* out, std::string* why);
bool parse_text(std::string_view s, uint64_t* out, std::string* why);  // a size
bool parse_text(std::string_view s, UidList* out, std::string* why);
bool parse_text(std::string_view s, PathList* out, std::string* why);  // comma-separated

// A whole number from a file into a u32: false and `why` if negative or too large.
bool u32_from(int64_t v, uint32_t* out, std::string* why);

// A value as TOML writes it: strings quoted, sizes with their largest exact suffix ("64M").
std::string toml_text(const std::string& v);
std::string toml_text(bool v);
std::string toml_text(uint32_t v);
std::string toml_text(uint64_t v);
std::string toml_text(const UidList& v);
std::string toml_text(const PathList& v);

// A size without quotes: "64M" when a suffix divides it, else the plain number.
std::string size_text(uint64_t v);

// The value of `k` in `c` (or `ns`) as TOML text; "<set>" for a secret that is set.
std::string value_text(const KeyDef& k, const Config& c, const NamespaceConfig* ns);

// Sets `k` in `c` (or `ns`) from command-line text; on bad text leaves it and says why.
bool assign_text(const KeyDef& k, std::string_view text, Config& c, NamespaceConfig* ns, std::string* why);

// The namespace `name` of `c`, appended (with `line`) if it is not there yet.
NamespaceConfig& namespace_entry(Config& c, const std::string& name, int line);

// The tiers this build configures, for sections and "unknown tier" messages.
inline constexpr const char* kHostTierName = "host";
inline constexpr const char* kDiskTierName = "disk";
inline constexpr const char* kRemoteTierName = "remote";
inline constexpr const char* kGpuTierName = "gpu";
inline constexpr const char* kTierNames = "host, disk, remote, gpu";
// The section of [tier.NAME], or nullopt for a tier this build does not have.
std::optional<Section> tier_section(std::string_view name);
// What valid_namespace_name() accepts, for messages.
inline constexpr const char* kNamespaceNameRule =
    "a namespace name is 1 to 63 bytes of A-Z a-z 0-9 . _ - and does not start with '.'";

// Stores `message` in `*error` (if not null) and returns kInvalidArgument with `what`, a
// string literal.
Status config_error(std::string* error, std::string message, const char* what);

}  // namespace kdn::sidecar::config_table
