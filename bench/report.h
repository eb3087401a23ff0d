// A benchmark report: figures under dotted keys ("baselines.memcpy_gbps_1t" is
// {"baselines": {"memcpy_gbps_1t": ...}}), printed as JSON (--json) or as a human table.
// Keys keep the order they were first set in. A figure that could not be measured is null,
// never a made-up number.
//
// Bars: set_bar records a target next to the measured value, with pass true/false (null
// when the value is missing), under its key (e.g. "bars.retrieve_vs_memcpy").
//
// Thread safety: none; build a report from one thread.
#pragma once

#include "stats.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

namespace kdn::bench {

enum class BarOp { kAtLeast, kAtMost, kBelow };

class Report {
 public:
  using Json = nlohmann::ordered_json;

  void set(std::string_view key, double value);
  void set(std::string_view key, std::optional<double> value);  // null when empty
  template <class Int>
  requires(std::is_integral_v<Int> && !std::is_same_v<Int, bool>) void set(std::string_view key, Int value) {
    slot(key) = value;
  }
  void set(std::string_view key, bool value);
  void set(std::string_view key, std::string_view value);
  void set(std::string_view key, const char* value) { set(key, std::string_view(value)); }
  void set_null(std::string_view key);
  // Places a whole JSON value (e.g. another report's root) under `key`.
  void set_json(std::string_view key, Json value);

  // key = {"value": v, "op": ">=", "target": t, "pass": bool|null}
  void set_bar(std::string_view key, std::optional<double> value, BarOp op, double target);

  // The value under `key`, or null if nothing is there.
  const Json* find(std::string_view key) const;
  // The value under `key`, if it is a number (for ratios of figures already set).
  std::optional<double> number(std::string_view key) const;
  // True if every bar under `key` (an object of bars) is present and passes.
  bool all_bars_pass(std::string_view key) const;

  const Json& json() const noexcept { return root_; }
  std::string to_json(int indent = 2) const;
  // One line per figure: dotted key, value; bars as "value op target PASS|FAIL".
  std::string to_table() const;

 private:
  Json& slot(std::string_view key);
  Json root_ = Json::object();
};

// a / b when both are present and b > 0; empty otherwise.
std::optional<double> ratio(std::optional<double> a, std::optional<double> b) noexcept;

// `base`_p50_us, `base`_p99_us and `base`_max_us of a latency summary.
void set_latency(Report& r, const std::string& base, const LatencySummary& s);

}  // namespace kdn::bench
