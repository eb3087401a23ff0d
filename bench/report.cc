#include "report.h"

#include <cmath>
#include <cstdio>
#include <utility>
#include <vector>

namespace kdn::bench {
namespace {

const char* op_text(BarOp op) {
  switch (op) {
    case BarOp::kAtLeast:
      return ">=";
    case BarOp::kAtMost:
      return "<=";
    case BarOp::kBelow:
      return "<";
  }
  return "?";
}

bool meets(double value, BarOp op, double target) {
  switch (op) {
    case BarOp::kAtLeast:
      return value >= target;
    case BarOp::kAtMost:
      return value <= target;
    case BarOp::kBelow:
      return value < target;
  }
  return false;
}

std::string format_number(double v) {
  char buf[64];
  if (std::fabs(v) >= 1e4 && std::fabs(v) < 1e15) {
    std::snprintf(buf, sizeof buf, "%.0f", v);
  } else {
    std::snprintf(buf, sizeof buf, "%.4g", v);
  }
  return buf;
}

std::string format_value(const Report::Json& v) {
  if (v.is_null()) return "null";
  if (v.is_number_float()) return format_number(v.get<double>());
  if (v.is_string()) return v.get<std::string>();
  return v.dump();
}

bool is_bar(const Report::Json& v) {
  return v.is_object() && v.contains("pass") && v.contains("op") && v.contains("target");
}

std::string format_bar(const Report::Json& bar) {
  std::string pass = bar["pass"].is_null() ? "n/a" : (bar["pass"].get<bool>() ? "PASS" : "FAIL");
  return format_value(bar["value"]) + " " + bar["op"].get<std::string>() + " " + format_value(bar["target"]) + "  " +
         pass;
}

using Rows = std::vector<std::pair<std::string, std::string>>;

void flatten(const Report::Json& node, const std::string& prefix, Rows& rows) {
  if (node.is_object() && !is_bar(node)) {
    for (const auto& [name, child] : node.items()) {
      flatten(child, prefix.empty() ? name : prefix + "." + name, rows);
    }
    return;
  }
  rows.emplace_back(prefix, is_bar(node) ? format_bar(node) : format_value(node));
}

}  // namespace

Report::Json& Report::slot(std::string_view key) {
  Json* node = &root_;
  size_t start = 0;
  while (true) {
    size_t dot = key.find('.', start);
    std::string part(key.substr(start, dot == std::string_view::npos ? key.npos : dot - start));
    if (!node->is_object()) *node = Json::object();
    node = &(*node)[part];
    if (dot == std::string_view::npos) return *node;
    start = dot + 1;
  }
}

void Report::set(std::string_view key, double value) {
  // JSON has no NaN or infinity: an undefined figure is null.
  if (std::isfinite(value)) {
    slot(key) = value;
  } else {
    slot(key) = nullptr;
  }
}

void Report::set(std::string_view key, std::optional<double> value) {
  if (value) {
    set(key, *value);
  } else {
    set_null(key);
  }
}

void Report::set(std::string_view key, bool value) { slot(key) = value; }
void Report::set(std::string_view key, std::string_view value) { slot(key) = std::string(value); }
void Report::set_null(std::string_view key) { slot(key) = nullptr; }
void Report::set_json(std::string_view key, Json value) { slot(key) = std::move(value); }

void Report::set_bar(std::string_view key, std::optional<double> value, BarOp op, double target) {
  Json bar = Json::object();
  bar["value"] = value && std::isfinite(*value) ? Json(*value) : Json(nullptr);
  bar["op"] = op_text(op);
  bar["target"] = target;
  bar["pass"] = bar["value"].is_null() ? Json(nullptr) : Json(meets(*value, op, target));
  slot(key) = std::move(bar);
}

const Report::Json* Report::find(std::string_view key) const {
  const Json* node = &root_;
  size_t start = 0;
  while (true) {
    size_t dot = key.find('.', start);
    std::string part(key.substr(start, dot == std::string_view::npos ? key.npos : dot - start));
    if (!node->is_object() || !node->contains(part)) return nullptr;
    node = &node->at(part);
    if (dot == std::string_view::npos) return node;
    start = dot + 1;
  }
}

std::optional<double> Report::number(std::string_view key) const {
  const Json* node = find(key);
  if (node == nullptr || !node->is_number()) return std::nullopt;
  return node->get<double>();
}

bool Report::all_bars_pass(std::string_view key) const {
  const Json* bars = find(key);
  if (bars == nullptr || !bars->is_object() || bars->empty()) return false;
  for (const auto& [name, bar] : bars->items()) {
    if (!is_bar(bar) || !bar["pass"].is_boolean() || !bar["pass"].get<bool>()) return false;
  }
  return true;
}

std::string Report::to_json(int indent) const { return root_.dump(indent); }

std::string Report::to_table() const {
  Rows rows;
  flatten(root_, "", rows);
  size_t width = 0;
  for (const auto& row : rows) width = std::max(width, row.first.size());
  std::string out;
  for (const auto& [key, value] : rows) {
    out += key;
    out.append(width + 2 - key.size(), ' ');
    out += value;
    out += '\n';
  }
  return out;
}

std::optional<double> ratio(std::optional<double> a, std::optional<double> b) noexcept {
  if (!a || !b || !(*b > 0)) return std::nullopt;
  return *a / *b;
}

void set_latency(Report& r, const std::string& base, const LatencySummary& s) {
  r.set(base + "_p50_us", s.p50_us);
  r.set(base + "_p99_us", s.p99_us);
  r.set(base + "_max_us", s.max_us);
}

}  // namespace kdn::bench
