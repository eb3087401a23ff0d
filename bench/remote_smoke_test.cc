// End to end: kdn-bench remote with small sizes, on loopback (its own 3+3 Redis Cluster) and
// behind its shaped link (where it may make one). Checks that every figure is measured or
// null with a reason, that no side read a wrong byte, that the connection counts agree, and
// that the bench left no redis-server and no network namespace behind. Does not judge the
// figures (that is the benchmark's job). Skipped where Debian's redis-server is not installed.
#include "smoke_util.h"

#include <kdn/common/testing/require.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace {

using kdn::bench::smoke::at;
using kdn::bench::smoke::BenchRun;
using kdn::bench::smoke::run_bench;

bool redis_installed() {
  return std::system("command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1") == 0;
}

// True while a process runs with `dir` in its command line (the cluster's servers do).
bool process_mentions(const std::string& dir) {
  if (dir.empty()) return false;
  // "[/]tmp/..." matches the directory but not this pgrep's own command line (nor its shell's).
  const std::string cmd = "pgrep -f -- '[" + dir.substr(0, 1) + "]" + dir.substr(1) + "' >/dev/null 2>&1";
  return std::system(cmd.c_str()) == 0;
}

TEST(RemoteBenchSmokeTest, MeasuresFetchAndLookupAgainstHiredisOnLoopback) {
  if (!redis_installed()) KDN_SKIP_OR_FAIL("REDIS", "redis-server is not installed (Debian: redis-server)");
  BenchRun run = run_bench(
      "remote --json --no-link --chunk-bytes 262144 --chunks 48 --depth 8 --repeats 2 --probe-samples 200 "
      "--llama-size 512 --llama-reps 1");
  ASSERT_EQ(run.exit_code, 0) << run.said();
  nlohmann::json j = nlohmann::json::parse(run.stdout_text, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << run.stdout_text;
  for (const char* key :
       {"kdn.t3_fetch_gbps", "kdn.t3_write_gbps", "kdn.t3_lookup_rtt_p50_us", "kdn.t3_lookup_rtt_p99_us",
        "baselines.redis_get_gbps", "baselines.redis_exists_rtt_p50_us", "ratios.t3_fetch_vs_redis_get"}) {
    const nlohmann::json& v = at(j, key);
    EXPECT_TRUE(v.is_number()) << key << " = " << v << "\n" << run.said();
  }
  EXPECT_GT(at(j, "kdn.t3_fetch_gbps").get<double>(), 0.0);
  EXPECT_EQ(at(j, "kdn.t3_fetch_gbps_runs").size(), 2u);
  EXPECT_EQ(at(j, "kdn.t3_wrong_bytes").get<uint64_t>(), 0u);
  EXPECT_EQ(at(j, "baselines.redis_wrong_bytes").get<uint64_t>(), 0u);
  EXPECT_EQ(at(j, "kdn.t3_failed_reads").get<uint64_t>(), 0u);
  EXPECT_EQ(at(j, "kdn.t3_lookup_failures").get<uint64_t>(), 0u);
  EXPECT_EQ(at(j, "kdn.t3_lookup_keys").get<uint64_t>(), 16u);
  // As many connections on each side: the pool (2 by default) times 3 masters.
  EXPECT_EQ(at(j, "config.connections").get<uint64_t>(), 6u);
  EXPECT_EQ(at(j, "config.baseline_connections").get<uint64_t>(), 6u);
  EXPECT_EQ(at(j, "wrong_bytes_total").get<uint64_t>(), 0u);
  EXPECT_TRUE(at(j, "bars.wrong_bytes.pass").get<bool>());
  EXPECT_TRUE(at(j, "bars.t3_fetch_vs_redis_get.pass").is_boolean());
  // The link part says why it did not run; its figures are null, never invented.
  EXPECT_EQ(at(j, "link.skipped").get<std::string>(), "--no-link");
  EXPECT_TRUE(at(j, "link.kdn.t3_fetch_gbps_by_codec.kivi4").is_null());
  EXPECT_TRUE(at(j, "bars.kivi4_vs_none_on_link.pass").is_null());
  // End to end (with llama.cpp in this build): node B's engine got node A's prompt from T3.
  if (j.contains("llama")) {
    EXPECT_TRUE(at(j, "llama.tokens_identical").get<bool>()) << run.said();
    EXPECT_EQ(at(j, "llama.chunks").get<uint64_t>(), 2u);  // 512 tokens of 256-token chunks
    for (const char* key : {"kdn.ttft_remote_hit_s", "kdn.ttft_hit_s", "baselines.ttft_miss_s"})
      EXPECT_GT(at(j, key).get<double>(), 0.0) << key;
  } else {
    EXPECT_TRUE(at(j, "errors.llama").is_string()) << run.said();
  }
  // Every server stopped and its directory removed.
  const std::string dir = at(j, "config.cluster_dir").get<std::string>();
  ASSERT_FALSE(dir.empty());
  EXPECT_FALSE(process_mentions(dir));
  EXPECT_FALSE(std::filesystem::exists(dir));
}

// Behind the shaped link (root only; otherwise the report says why it skipped it): codec none
// and hiredis measured, every other codec measured or null with the tier's reason, nothing
// wrong, and the namespace and its servers gone afterwards.
TEST(RemoteBenchSmokeTest, ReadsEveryCodecBehindARateLimitedLink) {
  if (!redis_installed()) KDN_SKIP_OR_FAIL("REDIS", "redis-server is not installed (Debian: redis-server)");
  BenchRun run = run_bench(
      "remote --json --no-llama --chunk-bytes 262144 --chunks 16 --depth 4 --repeats 1 --probe-samples 50 --link-mib "
      "1");
  ASSERT_EQ(run.exit_code, 0) << run.said();
  nlohmann::json j = nlohmann::json::parse(run.stdout_text, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << run.stdout_text;
  if (j["link"].contains("skipped")) {
    EXPECT_FALSE(at(j, "link.skipped").get<std::string>().empty());
    EXPECT_TRUE(at(j, "link.kdn.t3_fetch_gbps_by_codec.none").is_null());
    KDN_SKIP_OR_FAIL("IPROUTE", "the rate-limited link was skipped (it needs root and iproute2's ip and tc): " +
                                    at(j, "link.skipped").get<std::string>());
  }
  EXPECT_GT(at(j, "link.kdn.t3_fetch_gbps_by_codec.none").get<double>(), 0.0) << run.said();
  EXPECT_GT(at(j, "link.baselines.redis_get_gbps").get<double>(), 0.0) << run.said();
  EXPECT_EQ(at(j, "link.chunks").get<uint64_t>(), 4u);
  for (const char* codec : {"lossless", "int8", "kivi4"}) {
    const nlohmann::json& v = at(j, std::string("link.kdn.t3_fetch_gbps_by_codec.") + codec);
    if (v.is_null()) {
      EXPECT_TRUE(at(j, std::string("link.kdn.t3_fetch_gbps_by_codec.errors.") + codec).is_string()) << codec;
    } else {
      EXPECT_GT(v.get<double>(), 0.0) << codec;
      EXPECT_EQ(at(j, std::string("link.kdn.wrong_bytes.") + codec).get<uint64_t>(), 0u) << codec;
    }
  }
  // Where the passes' CPU went: present for every codec read; too short here for the bound.
  EXPECT_GT(at(j, "link.cpu.none.wall_s").get<double>(), 0.0);
  for (const char* part : {"self_core_s_per_gb", "redis_core_s_per_gb", "rest_core_s_per_gb"})
    EXPECT_GE(at(j, std::string("link.cpu.none.") + part).get<double>(), 0.0) << part;
  const double busy = at(j, "link.cpu.none.machine_busy_fraction").get<double>();
  EXPECT_GE(busy, 0.0);
  EXPECT_LE(busy, 1.5) << "busy time is counted in ticks: a short pass may overshoot, not by half";
  EXPECT_EQ(at(j, "wrong_bytes_total").get<uint64_t>(), 0u);
  const std::string netns = at(j, "link.netns").get<std::string>();
  EXPECT_NE(std::system(("ip netns list | grep -qw " + netns).c_str()), 0) << netns << " is still there";
  const std::string dir = at(j, "link.cluster_dir").get<std::string>();
  EXPECT_FALSE(process_mentions(dir));
  EXPECT_FALSE(std::filesystem::exists(dir));
}

TEST(RemoteBenchSmokeTest, RefusesAnUnknownModel) {
  BenchRun run = run_bench("remote --json --model no-such-model");
  EXPECT_EQ(run.exit_code, 2);
}

}  // namespace
