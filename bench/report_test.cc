#include "report.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace kdn::bench {
namespace {

TEST(ReportTest, DottedKeysNest) {
  Report r;
  r.set("baselines.memcpy_gbps_1t", 12.5);
  r.set("baselines.memcpy_gbps_pt", 20.0);
  r.set("kdn.hit_ratio", 0.5);
  const Report::Json& j = r.json();
  ASSERT_TRUE(j["baselines"].is_object());
  EXPECT_DOUBLE_EQ(j["baselines"]["memcpy_gbps_1t"].get<double>(), 12.5);
  EXPECT_DOUBLE_EQ(j["baselines"]["memcpy_gbps_pt"].get<double>(), 20.0);
  EXPECT_DOUBLE_EQ(j["kdn"]["hit_ratio"].get<double>(), 0.5);
  EXPECT_EQ(j.size(), 2u);
}

TEST(ReportTest, KeepsInsertionOrder) {
  Report r;
  r.set("z.first", 1.0);
  r.set("a.second", 2.0);
  EXPECT_EQ(r.json().begin().key(), "z");
}

TEST(ReportTest, MissingAndNonFiniteFiguresAreNull) {
  Report r;
  r.set("a", std::optional<double>());
  r.set("b", std::numeric_limits<double>::quiet_NaN());
  r.set("c", std::numeric_limits<double>::infinity());
  r.set_null("d");
  for (const char* k : {"a", "b", "c", "d"}) EXPECT_TRUE(r.json()[k].is_null()) << k;
  EXPECT_EQ(r.to_json(-1), R"({"a":null,"b":null,"c":null,"d":null})");
}

TEST(ReportTest, IntegersStringsAndBools) {
  Report r;
  r.set("n.u", uint64_t{1} << 40);
  r.set("n.i", -3);
  r.set("s", "text");
  r.set("b", true);
  EXPECT_EQ(r.json()["n"]["u"].get<uint64_t>(), uint64_t{1} << 40);
  EXPECT_EQ(r.json()["n"]["i"].get<int64_t>(), -3);
  EXPECT_EQ(r.json()["s"].get<std::string>(), "text");
  EXPECT_TRUE(r.json()["b"].get<bool>());
}

TEST(ReportTest, NumberFindsOnlyNumbers) {
  Report r;
  r.set("x.y", 2.5);
  r.set("x.s", "no");
  EXPECT_EQ(r.number("x.y"), 2.5);
  EXPECT_FALSE(r.number("x.s"));
  EXPECT_FALSE(r.number("x.missing"));
  EXPECT_FALSE(r.number("x.y.deeper"));
  EXPECT_EQ(r.find("x.missing"), nullptr);
  ASSERT_NE(r.find("x"), nullptr);
}

TEST(ReportTest, BarsRecordValueTargetAndVerdict) {
  Report r;
  r.set_bar("bars.fast", 0.9, BarOp::kAtLeast, 0.8);
  r.set_bar("bars.slow", 0.7, BarOp::kAtLeast, 0.8);
  r.set_bar("bars.tight", 3.0, BarOp::kAtMost, 3.0);
  r.set_bar("bars.strict", 1.0, BarOp::kBelow, 1.0);
  r.set_bar("bars.unmeasured", std::nullopt, BarOp::kBelow, 1.0);
  const Report::Json& bars = r.json()["bars"];
  EXPECT_TRUE(bars["fast"]["pass"].get<bool>());
  EXPECT_FALSE(bars["slow"]["pass"].get<bool>());
  EXPECT_TRUE(bars["tight"]["pass"].get<bool>());
  EXPECT_FALSE(bars["strict"]["pass"].get<bool>());
  EXPECT_TRUE(bars["unmeasured"]["pass"].is_null());
  EXPECT_TRUE(bars["unmeasured"]["value"].is_null());
  EXPECT_EQ(bars["fast"]["op"].get<std::string>(), ">=");
  EXPECT_DOUBLE_EQ(bars["fast"]["target"].get<double>(), 0.8);
}

TEST(ReportTest, AllBarsPassNeedsEveryBarMeasuredAndPassing) {
  Report r;
  EXPECT_FALSE(r.all_bars_pass("bars"));
  r.set_bar("bars.a", 2.0, BarOp::kAtLeast, 1.0);
  EXPECT_TRUE(r.all_bars_pass("bars"));
  r.set_bar("bars.b", std::nullopt, BarOp::kAtLeast, 1.0);
  EXPECT_FALSE(r.all_bars_pass("bars"));
  r.set_bar("bars.b", 0.5, BarOp::kAtLeast, 1.0);
  EXPECT_FALSE(r.all_bars_pass("bars"));
}

TEST(ReportTest, TableHasOneAlignedRowPerFigure) {
  Report r;
  r.set("baselines.memcpy_gbps_1t", 12.3456);
  r.set("kdn.lookup_rtt_p50_us", std::optional<double>());
  r.set_bar("bars.retrieve_vs_memcpy", 0.85, BarOp::kAtLeast, 0.8);
  std::string table = r.to_table();
  EXPECT_NE(table.find("baselines.memcpy_gbps_1t  12.35\n"), std::string::npos) << table;
  EXPECT_NE(table.find("kdn.lookup_rtt_p50_us     null\n"), std::string::npos) << table;
  EXPECT_NE(table.find("bars.retrieve_vs_memcpy   0.85 >= 0.8  PASS\n"), std::string::npos) << table;
}

TEST(ReportTest, SetJsonPlacesSubtrees) {
  Report src;
  src.set("kdn.retrieve_gbps", 10.0);
  Report dst;
  dst.set_json("models.m.kdn", *src.find("kdn"));
  EXPECT_EQ(dst.number("models.m.kdn.retrieve_gbps"), 10.0);
}

TEST(RatioTest, NeedsBothFiguresAndAPositiveDenominator) {
  EXPECT_EQ(ratio(6.0, 3.0), 2.0);
  EXPECT_FALSE(ratio(std::nullopt, 3.0));
  EXPECT_FALSE(ratio(6.0, std::nullopt));
  EXPECT_FALSE(ratio(6.0, 0.0));
}

}  // namespace
}  // namespace kdn::bench
