// Reading and writing the values of the key table's rows: lookups, command-line text, TOML
// text, and the "did you mean" hint for unknown keys.
#include "config_table.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>

namespace kdn::sidecar::config_table {
namespace {

std::string_view trim(std::string_view s) {
  const size_t b = s.find_first_not_of(" \t");
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

// Levenshtein distance; key names are short, so the quadratic table is nothing.
size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// How close `name` is to row `k`: its own name or its former one.
size_t distance_to(const KeyDef& k, std::string_view name) {
  size_t d = edit_distance(name, local_name(k));
  if (k.formerly) d = std::min(d, edit_distance(name, k.formerly));
  return d;
}

// "64M" for 64 MiB: the largest suffix that divides the value; "" if none does.
std::string size_with_suffix(uint64_t v) {
  static constexpr struct {
    int shift;
    char suffix;
  } kUnits[] = {{40, 'T'}, {30, 'G'}, {20, 'M'}, {10, 'K'}};
  if (v == 0) return "";
  for (const auto& u : kUnits)
    if (v % (uint64_t{1} << u.shift) == 0) return std::to_string(v >> u.shift) + u.suffix;
  return "";
}

}  // namespace

std::string size_text(uint64_t v) {
  std::string s = size_with_suffix(v);
  return s.empty() ? std::to_string(v) : s;
}

Status config_error(std::string* error, std::string message, const char* what) {
  if (error) *error = std::move(message);
  return Status(Code::kInvalidArgument, what);
}

std::optional<Section> tier_section(std::string_view name) {
  if (name == kHostTierName) return Section::kTierHost;
  if (name == kDiskTierName) return Section::kTierDisk;
  if (name == kRemoteTierName) return Section::kTierRemote;
  if (name == kGpuTierName) return Section::kTierGpu;
  return std::nullopt;
}

Section section_of(const KeyDef& k) {
  return std::visit(
      [](auto member) {
        using Owner = typename MemberTraits<decltype(member)>::Owner;
        if constexpr (std::is_same_v<Owner, Config>)
          return Section::kDaemon;
        else if constexpr (std::is_same_v<Owner, HostTierConfig>)
          return Section::kTierHost;
        else if constexpr (std::is_same_v<Owner, DiskTierConfig>)
          return Section::kTierDisk;
        else if constexpr (std::is_same_v<Owner, RemoteTierConfig>)
          return Section::kTierRemote;
        else if constexpr (std::is_same_v<Owner, GpuTierConfig>)
          return Section::kTierGpu;
        else
          return Section::kNamespace;
      },
      k.field);
}

std::string_view local_name(const KeyDef& k) {
  const std::string_view key(k.key);
  return key.substr(key.rfind('.') + 1);  // npos + 1 == 0: a top-level key is its own name
}

const KeyDef* find_key(Section section, std::string_view name) {
  for (const KeyDef& k : keys())
    if (section_of(k) == section && local_name(k) == name) return &k;
  return nullptr;
}

std::string dotted_key(const KeyDef& k, std::string_view ns) {
  if (section_of(k) != Section::kNamespace || ns.empty()) return k.key;
  return "namespace." + std::string(ns) + "." + std::string(local_name(k));
}

const KeyDef& row_of(const Field& member) {
  for (const KeyDef& k : keys())
    if (k.field == member) return k;
  std::abort();  // our bug: a check names a member the table lacks
}

std::string did_you_mean(Section section, std::string_view name, std::string_view ns) {
  const KeyDef* best = nullptr;
  size_t best_score = ~size_t{0};
  for (const KeyDef& k : keys()) {
    const size_t d = distance_to(k, name);
    const size_t score = 2 * d + (section_of(k) == section ? 0 : 1);
    if (d <= 2 && score < best_score) best = &k, best_score = score;
  }
  if (!best) return "";
  return " (did you mean '" + dotted_key(*best, section == Section::kNamespace ? ns : "") + "'?)";
}

const char* type_name(const KeyDef& k) {
  return std::visit(
      [](auto member) {
        using T = typename MemberTraits<decltype(member)>::Type;
        if constexpr (std::is_same_v<T, std::string>)
          return "string";
        else if constexpr (std::is_same_v<T, bool>)
          return "bool";
        else if constexpr (std::is_same_v<T, uint32_t>)
          return "u32";
        else if constexpr (std::is_same_v<T, uint64_t>)
          return "size";
        else if constexpr (std::is_same_v<T, PathList>)
          return "list of strings";
        else
          return "list of u32";
      },
      k.field);
}

// True when `s` is well-formed UTF-8 (no overlong forms, surrogates or code points past U+10FFFF):
// a configuration file is TOML, and TOML text is UTF-8.
bool valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<unsigned char>(s[i]);
    size_t len = 0;
    uint32_t cp = 0;
    if (b < 0x80)
      len = 1, cp = b;
    else if ((b & 0xE0) == 0xC0)
      len = 2, cp = b & 0x1F;
    else if ((b & 0xF0) == 0xE0)
      len = 3, cp = b & 0x0F;
    else if ((b & 0xF8) == 0xF0)
      len = 4, cp = b & 0x07;
    else
      return false;
    if (i + len > s.size()) return false;
    for (size_t k = 1; k < len; ++k) {
      const auto c = static_cast<unsigned char>(s[i + k]);
      if ((c & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (c & 0x3F);
    }
    static constexpr uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += len;
  }
  return true;
}

bool parse_text(std::string_view s, std::string* out, std::string* why) {
  if (!valid_utf8(s)) {
    *why = "not valid UTF-8 text";
    return false;
  }
  if (s.find('\0') != std::string_view::npos) {
    *why = "holds a NUL byte";
    return false;
  }
  *out = std::string(s);
  return true;
}

bool parse_text(std::string_view s, bool* out, std::string* why) {
  if (s == "true" || s == "yes" || s == "1") return *out = true, true;
  if (s == "false" || s == "no" || s == "0") return *out = false, true;
  *why = "not a bool (true, false, yes, no, 1 or 0)";
  return false;
}

bool parse_text(std::string_view s, uint32_t* out, std::string* why) {
  s = trim(s);
  if (!s.empty() && s[0] == '-' && s.size() > 1) {
    *why = "must not be negative";
    return false;
  }
  if (s.empty() || s.find_first_not_of("0123456789") != std::string_view::npos) {
    *why = "not a whole number";
    return false;
  }
  const std::string digits(s);
  errno = 0;
  const unsigned long long v = std::strtoull(digits.c_str(), nullptr, 10);
  if (errno == ERANGE || v > UINT32_MAX) {
    *why = "too large (at most 4294967295)";
    return false;
  }
  *out = uint32_t(v);
  return true;
}

bool parse_text(std::string_view s, uint64_t* out, std::string* why) {
  if (parse_size(std::string(trim(s)), out)) return true;
  *why = trim(s).starts_with('-') ? "must not be negative" : "not a size (a number with K, M, G or T)";
  return false;
}

bool parse_text(std::string_view s, UidList* out, std::string* why) {
  s = trim(s);
  if (s.starts_with('[') && s.ends_with(']')) s = trim(s.substr(1, s.size() - 2));  // as printed
  UidList list;
  for (size_t start = 0; !s.empty() && start <= s.size();) {
    const size_t comma = std::min(s.find(',', start), s.size());
    uint32_t v = 0;
    if (!parse_text(s.substr(start, comma - start), &v, why)) {
      *why = "element " + std::to_string(list.size() + 1) + ": " + *why;
      return false;
    }
    list.push_back(v);
    start = comma + 1;
  }
  *out = std::move(list);
  return true;
}

bool parse_text(std::string_view s, PathList* out, std::string* why) {
  s = trim(s);
  if (s.starts_with('[') && s.ends_with(']')) s = trim(s.substr(1, s.size() - 2));  // as printed
  PathList list;
  for (size_t start = 0; !s.empty() && start <= s.size();) {
    const size_t comma = std::min(s.find(',', start), s.size());
    std::string_view item = trim(s.substr(start, comma - start));
    if (item.size() >= 2 && item.front() == '"' && item.back() == '"') item = item.substr(1, item.size() - 2);
    if (item.empty()) {
      *why = "element " + std::to_string(list.size() + 1) + " is empty";
      return false;
    }
    list.emplace_back(item);
    start = comma + 1;
  }
  *out = std::move(list);
  return true;
}

bool u32_from(int64_t v, uint32_t* out, std::string* why) {
  if (v < 0)
    *why = "must not be negative";
  else if (v > int64_t{UINT32_MAX})
    *why = "too large (at most 4294967295)";
  else
    return *out = uint32_t(v), true;
  return false;
}

std::string toml_text(const std::string& v) {
  std::string out = "\"";
  for (const char ch : v) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\')
      out += '\\', out += ch;
    else if (c == '\n')
      out += "\\n";
    else if (c == '\t')
      out += "\\t";
    else if (c < 0x20 || c == 0x7f) {
      char esc[8];
      std::snprintf(esc, sizeof esc, "\\u%04x", c);
      out += esc;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

std::string toml_text(bool v) { return v ? "true" : "false"; }

std::string toml_text(uint32_t v) { return std::to_string(v); }

std::string toml_text(uint64_t v) {
  if (std::string s = size_with_suffix(v); !s.empty()) return "\"" + s + "\"";
  // TOML integers are signed 64-bit; a larger size still loads as a string.
  if (v > uint64_t{INT64_MAX}) return "\"" + std::to_string(v) + "\"";
  return std::to_string(v);
}

std::string toml_text(const UidList& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  return out + "]";
}

std::string toml_text(const PathList& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + toml_text(v[i]);
  return out + "]";
}

std::string value_text(const KeyDef& k, const Config& c, const NamespaceConfig* ns) {
  std::string out;
  with_value(k, c, ns, [&](const auto& v) { out = toml_text(v); });
  if (k.secret && out != "\"\"") return "\"<set>\"";
  return out;
}

bool assign_text(const KeyDef& k, std::string_view text, Config& c, NamespaceConfig* ns, std::string* why) {
  bool ok = false;
  with_value(k, c, ns, [&](auto& v) {
    std::remove_cvref_t<decltype(v)> parsed{};
    ok = parse_text(text, &parsed, why);
    if (ok) v = std::move(parsed);
  });
  return ok;
}

NamespaceConfig& namespace_entry(Config& c, const std::string& name, int line) {
  for (NamespaceConfig& ns : c.namespaces)
    if (ns.name == name) return ns;
  NamespaceConfig& ns = c.namespaces.emplace_back();
  ns.name = name;
  ns.line = line;
  return ns;
}

}  // namespace kdn::sidecar::config_table
