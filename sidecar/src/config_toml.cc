// Config::load_toml: a TOML file over the current values, with messages that name the file,
// the line, the key and the value as written.
//
// toml++ keeps a table's keys sorted by name, not by position, so the walk first lists what
// the file says (assignments, namespace declarations, structural errors) with their
// positions, then applies that list in file order: namespaces are declared in the order the
// file gives them, and the error reported is the first one in the file. toml++ reports
// syntax errors by exception; they stop here.
#include <kdn/sidecar/config.h>

#include "config_table.h"

#include <kdn/ipc/fd.h>

#include <fcntl.h>
#include <unistd.h>

#include <toml++/toml.h>
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <sstream>

namespace kdn::sidecar {

using config_table::KeyDef;
using config_table::Section;
using config_table::UidList;

namespace {

// One thing the file says, at `at`.
struct Step {
  toml::source_position at;
  std::string error;                  // a structural error (unknown key, bad section), or
  std::string ns;                     // a namespace declared (key null) or assigned to
  const KeyDef* key = nullptr;        // a key assigned
  std::string dotted;                 // its dotted name as the file spells it
  const toml::node* value = nullptr;  // and its value
};

bool before(const Step& a, const Step& b) {
  return a.at.line != b.at.line ? a.at.line < b.at.line : a.at.column < b.at.column;
}

void add_error(std::vector<Step>* steps, const toml::key& k, std::string error) {
  steps->push_back({.at = k.source().begin, .error = std::move(error)});
}

// A value as the file writes it: strings in double quotes, a section as [..].
std::string as_written(const toml::node& n) {
  if (const auto* s = n.as_string()) return config_table::toml_text(s->get());
  if (const auto* t = n.as_table(); t && !t->is_inline()) return "[...]";
  std::ostringstream os;
  n.visit([&](const auto& v) { os << v; });
  return os.str();
}

// ---- the walk: what the file says, in toml++'s order

void walk_key(Section section, const std::string& prefix, const std::string& ns, const toml::key& k,
              const toml::node& v, std::vector<Step>* steps) {
  const std::string name(k.str());
  if (const KeyDef* def = config_table::find_key(section, name)) {
    steps->push_back({.at = k.source().begin, .ns = ns, .key = def, .dotted = prefix + name, .value = &v});
    return;
  }
  if (!v.is_table()) {
    add_error(steps, k, "unknown key '" + prefix + name + "'" + config_table::did_you_mean(section, name, ns));
    return;
  }
  std::string error = "unknown section '[" + prefix + name + "]'";
  if (section == Section::kNamespace)  // [namespace.team.a] nests tables; the name wanted quotes
    error += " (quote a namespace name that holds dots: [namespace.\"" + ns + "." + name + "\"])";
  add_error(steps, k, std::move(error));
}

void walk_section(Section section, const std::string& prefix, const std::string& ns, const toml::table& t,
                  std::vector<Step>* steps) {
  for (auto&& [k, v] : t) walk_key(section, prefix, ns, k, v, steps);
}

void walk_tiers(const toml::key& k, const toml::node& v, std::vector<Step>* steps) {
  const toml::table* tiers = v.as_table();
  if (!tiers) {
    add_error(steps, k, "tier = " + as_written(v) + ": tiers are sections, like [tier.host]");
    return;
  }
  for (auto&& [name, tier] : *tiers) {
    const std::string tier_name(name.str());
    const std::optional<Section> found = config_table::tier_section(tier_name);
    if (!found) {
      add_error(steps, name, "unknown tier '" + tier_name + "' (this kdnd has: " + config_table::kTierNames + ")");
      continue;
    }
    const Section section = *found;
    if (const toml::table* t = tier.as_table()) {
      walk_section(section, "tier." + tier_name + ".", "", *t, steps);
    } else {
      add_error(steps, name,
                "tier." + tier_name + " = " + as_written(tier) + ": expected a section [tier." + tier_name + "]");
    }
  }
}

void walk_namespaces(const toml::key& k, const toml::node& v, std::vector<Step>* steps) {
  const toml::table* namespaces = v.as_table();
  if (!namespaces) {
    add_error(steps, k, "namespace = " + as_written(v) + ": namespaces are sections, like [namespace.team-a]");
    return;
  }
  for (auto&& [key, section] : *namespaces) {
    const std::string name(key.str());
    const toml::table* t = section.as_table();
    if (!valid_namespace_name(name)) {
      add_error(steps, key, "[namespace." + config_table::toml_text(name) + "]: " + config_table::kNamespaceNameRule);
    } else if (!t) {
      add_error(steps, key,
                "namespace." + name + " = " + as_written(section) + ": expected a section [namespace." + name + "]");
    } else {
      steps->push_back({.at = key.source().begin, .ns = name});
      walk_section(Section::kNamespace, "namespace." + name + ".", name, *t, steps);
    }
  }
}

std::vector<Step> walk(const toml::table& root) {
  std::vector<Step> steps;
  for (auto&& [k, v] : root) {
    if (k.str() == "tier")
      walk_tiers(k, v, &steps);
    else if (k.str() == "namespace")
      walk_namespaces(k, v, &steps);
    else
      walk_key(Section::kDaemon, "", "", k, v, &steps);
  }
  std::stable_sort(steps.begin(), steps.end(), before);
  return steps;
}

// ---- values: a TOML node into each key type, false and `why` when it does not fit

bool from_node(const toml::node& n, std::string* out, std::string* why) {
  if (const auto* s = n.as_string()) return *out = s->get(), true;
  *why = "expected a string in quotes";
  return false;
}

bool from_node(const toml::node& n, bool* out, std::string* why) {
  if (const auto* b = n.as_boolean()) return *out = b->get(), true;
  *why = "expected true or false";
  return false;
}

bool from_node(const toml::node& n, uint32_t* out, std::string* why) {
  if (const auto* i = n.as_integer()) return config_table::u32_from(i->get(), out, why);
  *why = "expected a whole number";
  return false;
}

bool from_node(const toml::node& n, uint64_t* out, std::string* why) {  // a size
  if (const auto* i = n.as_integer()) {
    if (i->get() >= 0) return *out = uint64_t(i->get()), true;
    *why = "must not be negative";
    return false;
  }
  if (const auto* s = n.as_string()) return config_table::parse_text(s->get(), out, why);
  *why = "not a size (a number with K, M, G or T)";
  return false;
}

bool from_node(const toml::node& n, UidList* out, std::string* why) {
  const toml::array* a = n.as_array();
  if (!a) {
    *why = "expected a list of whole numbers, like [1001, 1002]";
    return false;
  }
  UidList list;
  for (const toml::node& e : *a) {
    uint32_t v = 0;
    if (!from_node(e, &v, why)) {
      *why = "element " + std::to_string(list.size() + 1) + " (" + as_written(e) + "): " + *why;
      return false;
    }
    list.push_back(v);
  }
  *out = std::move(list);
  return true;
}

bool from_node(const toml::node& n, config_table::PathList* out, std::string* why) {
  const toml::array* a = n.as_array();
  if (!a) {
    *why = "expected a list of strings, like [\"/nvme0/kdn\", \"/nvme1/kdn\"]";
    return false;
  }
  config_table::PathList list;
  for (const toml::node& e : *a) {
    std::string v;
    if (!from_node(e, &v, why) || v.empty()) {
      *why = "element " + std::to_string(list.size() + 1) + " (" + as_written(e) +
             "): " + (v.empty() && why->empty() ? std::string("empty") : *why);
      return false;
    }
    list.push_back(std::move(v));
  }
  *out = std::move(list);
  return true;
}

bool assign_node(const KeyDef& k, const toml::node& n, Config& c, NamespaceConfig* ns, std::string* why) {
  bool ok = false;
  config_table::with_value(k, c, ns, [&](auto& v) {
    std::remove_cvref_t<decltype(v)> parsed{};
    ok = from_node(n, &parsed, why);
    if (ok) v = std::move(parsed);
  });
  return ok;
}

// ---- reading the file

bool read_file(const std::string& path, std::string* text) {
  ipc::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY));
  if (!fd) return false;
  char buf[16384];
  for (;;) {
    const ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return false;
    if (n == 0) return true;
    text->append(buf, size_t(n));
  }
}

std::string at_line(const std::string& path, const toml::source_position& at) {
  return path + ":" + std::to_string(at.line) + ": ";
}

// Applies the walk's steps to `c` in file order; the first error stops it.
Status apply(const std::string& path, const std::vector<Step>& steps, Config* c, std::string* error) {
  for (const Step& s : steps) {
    if (!s.error.empty())
      return config_table::config_error(error, at_line(path, s.at) + s.error, "config: unknown key");
    NamespaceConfig* ns = s.ns.empty() ? nullptr : &config_table::namespace_entry(*c, s.ns, int(s.at.line));
    if (!s.key) {  // a declaration: a namespace already set from elsewhere takes the file's line
      ns->line = int(s.at.line);
      continue;
    }
    std::string why;
    if (!assign_node(*s.key, *s.value, *c, ns, &why))
      return config_table::config_error(
          error, at_line(path, s.at) + s.dotted + " = " + as_written(*s.value) + ": " + why, "config: bad value");
  }
  return OkStatus();
}

}  // namespace

Status Config::load_toml(const std::string& path, std::string* error) {
  std::string text;
  if (!read_file(path, &text)) {
    const int err = errno;
    if (error) *error = path + ": cannot read: " + std::strerror(err);
    return Status::from_errno("config: cannot read the file", err);
  }
  toml::table root;
  try {
    root = toml::parse(text, std::string_view(path));
  } catch (const toml::parse_error& e) {
    const toml::source_position at = e.source().begin;
    return config_table::config_error(error,
                                      path + ":" + std::to_string(at.line) + ":" + std::to_string(at.column) +
                                          ": TOML syntax error: " + std::string(e.description()),
                                      "config: TOML syntax error");
  }
  Config next = *this;  // all of the file or none of it
  KDN_RETURN_IF_ERROR(apply(path, walk(root), &next, error));
  *this = std::move(next);
  return OkStatus();
}

}  // namespace kdn::sidecar
