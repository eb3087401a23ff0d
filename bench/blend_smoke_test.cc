// End to end: kdn-bench blend with its default model and this build's kdnd, on a tiny workload
// (prompts of about 512 tokens). Checks that every figure is there and that the summaries are
// computed from the per-prompt figures the report lists (means, ratios, counts, bars), that
// `all` agrees with the full prefill everywhere, and that `none` recomputes nothing. Does not
// judge the figures themselves (that is the benchmark's job).
#include "smoke_util.h"

#include <cmath>
#include <vector>

namespace {

using kdn::bench::smoke::at;
using kdn::bench::smoke::BenchRun;
using kdn::bench::smoke::run_bench;

TEST(BlendBenchSmokeTest, ReportsWhatItsPromptsMeasured) {
  BenchRun run = run_bench("blend --json --sizes 512 --prompts 2 --policies hkvd,none,all --answer-tokens 8");
  ASSERT_EQ(run.exit_code, 0) << run.said();
  nlohmann::json j = nlohmann::json::parse(run.stdout_text, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << run.stdout_text;
  EXPECT_GE(at(j, "corpus.documents").get<int>(), 10);
  const nlohmann::json& rows = at(j, "sizes.512.per_prompt");
  ASSERT_EQ(rows.size(), 2u);
  double full = 0, prefix = 0, hkvd = 0, agree = 0;
  for (const auto& r : rows) {
    EXPECT_GE(r["passages"].size(), 4u);
    full += r["ttft_full_prefill_s"].get<double>();
    prefix += r["ttft_prefix_cache_s"].get<double>();
    hkvd += r["hkvd"]["ttft_blend_s"].get<double>();
    agree += r["hkvd"]["top1_agreement"].get<double>();
    EXPECT_TRUE(r["hkvd"]["blended"].get<bool>()) << r["hkvd"]["fallback"];
    EXPECT_EQ(r["none"]["tokens_recomputed"], 0);
    EXPECT_EQ(r["all"]["top1_agreement"], 1.0) << "recomputing everything is a full prefill";
    EXPECT_EQ(r["all"]["kl_mean"], 0.0);
    EXPECT_TRUE(r["all"]["answer_identical"].get<bool>());
    EXPECT_GE(r["floor_top1_agreement"].get<double>(), 0.0);
  }
  const std::string p = "sizes.512.";
  EXPECT_NEAR(at(j, p + "ttft_full_prefill_s").get<double>(), full / 2, 1e-9);
  EXPECT_NEAR(at(j, p + "ttft_prefix_cache_s").get<double>(), prefix / 2, 1e-9);
  EXPECT_NEAR(at(j, p + "policies.hkvd.ttft_blend_s").get<double>(), hkvd / 2, 1e-9);
  EXPECT_NEAR(at(j, p + "policies.hkvd.speedup_vs_full").get<double>(), full / hkvd, 1e-9);
  EXPECT_NEAR(at(j, p + "policies.hkvd.top1_agreement").get<double>(), agree / 2, 1e-9);
  const auto ci = at(j, p + "policies.hkvd.top1_agreement_ci95").get<std::vector<double>>();
  ASSERT_EQ(ci.size(), 2u);
  EXPECT_LE(ci[0], agree / 2 + 1e-9);
  EXPECT_GE(ci[1], agree / 2 - 1e-9);
  EXPECT_NEAR(at(j, p + "policies.hkvd.recomputed_fraction").get<double>(), 0.15, 0.01);
  EXPECT_EQ(at(j, p + "policies.none.recomputed_fraction").get<double>(), 0.0);
  EXPECT_EQ(at(j, p + "policies.all.top1_agreement").get<double>(), 1.0);
  EXPECT_EQ(at(j, p + "policies.hkvd.prompts").get<int>(), 2);
  for (const char* key : {"kl_mean", "answers_identical_fraction", "served_from_cache", "speedup_vs_prefix_cache"})
    EXPECT_TRUE(at(j, p + "policies.hkvd." + key).is_number()) << key;
  EXPECT_TRUE(at(j, "bars.none_below_hkvd.pass").is_boolean());
  EXPECT_TRUE(at(j, "bars.hkvd_vs_prefix_cache_mean_ttft.pass").is_boolean());
}

TEST(BlendBenchSmokeTest, RefusesUnknownPoliciesAndMismatchedCounts) {
  EXPECT_EQ(run_bench("blend --policies magic").exit_code, 2);
  EXPECT_EQ(run_bench("blend --sizes 512,1024 --prompts 2").exit_code, 2);
  EXPECT_EQ(run_bench("blend --sizes 512,1024 --pool 6").exit_code, 2);
  EXPECT_EQ(run_bench("blend --sizes 512 --pool 0").exit_code, 2) << "refused by the option's range check";
}

}  // namespace
