// End to end: kdn-bench node against the kdnd of this build, on a tiny plan. Checks that
// every required figure is measured, that retrieved data was what was stored, and that
// kdnd stopped cleanly. Does not judge the figures themselves (that is the benchmark's job).
#include "smoke_util.h"

namespace {

using kdn::bench::smoke::at;
using kdn::bench::smoke::BenchRun;
using kdn::bench::smoke::run_bench;

TEST(NodeBenchSmokeTest, MeasuresEveryFigureAgainstARealKdnd) {
  BenchRun run = run_bench(
      "node --json --model smollm2-135m --processes 2 --docs 4 --requests 8 --arena-gib 1 "
      "--idle-seconds 1 --lookup-samples 2000 --retrieve-passes 1 --memcpy-mib 16 "
      "--integrity-chunks 2 --no-redis --staging-churn-written-mib 64");
  ASSERT_EQ(run.exit_code, 0) << run.said();
  nlohmann::json j = nlohmann::json::parse(run.stdout_text, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << run.stdout_text;

  for (const char* key : {"baselines.memcpy_gbps_1t",
                          "baselines.memcpy_gbps_pt",
                          "baselines.copy_gbps_pt",
                          "baselines.stream_copy_gbps_pt",
                          "baselines.integrity.verify_read_vs_copy_pt",
                          "baselines.uds_echo_rtt_p50_us",
                          "baselines.spin_pingpong_rtt_p50_us",
                          "kdn.retrieve_gbps",
                          "kdn.store_gbps",
                          "kdn.lookup_rtt_p50_us",
                          "kdn.lookup_rtt_p99_us",
                          "kdn.hit_ratio",
                          "kdn.idle_cpu_percent",
                          "ratios.retrieve_vs_copy",
                          "ratios.store_vs_copy",
                          "ratios.retrieve_vs_memcpy",
                          "ratios.lookup_vs_uds",
                          "kdn.staging_churn.ping_idle_p99_us",
                          "kdn.staging_churn.ping_under_staging_churn_p99_us",
                          "kdn.staging_churn.ping_under_staging_churn_max_us",
                          "ratios.ping_p99_under_staging_churn_vs_idle"}) {
    const nlohmann::json& v = at(j, key);
    EXPECT_TRUE(v.is_number()) << key << " = " << v;
    if (v.is_number()) {
      EXPECT_GE(v.get<double>(), 0.0) << key;
    }
  }
  EXPECT_GT(at(j, "kdn.retrieve_gbps").get<double>(), 0.0);
  EXPECT_GT(at(j, "kdn.store_gbps").get<double>(), 0.0);
  EXPECT_LE(at(j, "kdn.hit_ratio").get<double>(), 1.0);
  EXPECT_GT(at(j, "kdn.staging_churn.staging_churn_sessions_per_s").get<double>(), 0.0) << "no churn happened";
  // Redis was skipped: its figures and the ratio built on them are null, not invented.
  EXPECT_TRUE(at(j, "baselines.redis_get_gbps").is_null());
  EXPECT_TRUE(at(j, "ratios.retrieve_vs_redis").is_null());
  EXPECT_TRUE(at(j, "bars.retrieve_vs_redis.pass").is_null());
  EXPECT_TRUE(at(j, "bars.retrieve_vs_copy.pass").is_boolean());
  EXPECT_TRUE(at(j, "bars.store_vs_copy.pass").is_boolean());
  EXPECT_FALSE(at(j, "bars").contains("retrieve_vs_memcpy"));  // informational: no bar

  const std::string model = "models.smollm2-135m.";
  EXPECT_EQ(at(j, model + "kdn.corrupt_chunks").get<uint64_t>(), 0u);
  EXPECT_EQ(at(j, model + "kdn.retrieve_phase_hit_ratio").get<double>(), 1.0);
  EXPECT_EQ(at(j, model + "kdn.lookup_not_fully_cached").get<uint64_t>(), 0u);
  EXPECT_EQ(at(j, model + "kdnd.protocol_errors").get<uint64_t>(), 0u);
  EXPECT_EQ(at(j, model + "kdnd.exit_after_sigterm").get<std::string>(), "exit 0");
  EXPECT_EQ(at(j, model + "kdn.zipf.requests").get<uint64_t>(), 8u);
}

TEST(NodeBenchSmokeTest, MissingKdndIsAUsageError) {
  BenchRun run = run_bench("node --kdnd /nonexistent/kdnd --model smollm2-135m");
  EXPECT_EQ(run.exit_code, 2);
}

}  // namespace
