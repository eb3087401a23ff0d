// End to end: kdn-bench soak for half a minute against this build's kdnd, with two engines. Checks
// what must hold whatever the machine: no byte served wrong, no error a client need not
// expect, at least one engine and one kdnd SIGKILLed (and restarted: the soak goes on and
// kdnd stops cleanly at the end), operations of every kind done, and the drift figures
// measured. The drift bars themselves are the benchmark's verdict, not this test's.
#include "smoke_util.h"
#include "soak_engine.h"

#include <cstdint>
#include <vector>

namespace {

using kdn::bench::smoke::at;
using kdn::bench::smoke::BenchRun;
using kdn::bench::smoke::run_bench;
namespace soak = kdn::bench::soak;

// The soak's verdict rests on this: a stamp checks clean against its own key, and every byte
// changed (or a chunk of another key) is counted.
TEST(SoakStampTest, CountsEveryWrongByte) {
  const kdn_key key{0x1234, 0x5678}, other{0x1234, 0x5679};
  std::vector<uint8_t> chunk(65536 + 3);  // a tail shorter than a word too
  soak::fill_stamp(key, chunk.data(), chunk.size());
  EXPECT_EQ(soak::count_wrong_bytes(key, chunk.data(), chunk.size()), 0u);
  chunk[0] ^= 0x01;
  chunk[70] ^= 0xFF;
  chunk[71] ^= 0x80;
  chunk.back() ^= 0x10;
  EXPECT_EQ(soak::count_wrong_bytes(key, chunk.data(), chunk.size()), 4u);
  soak::fill_stamp(key, chunk.data(), chunk.size());
  EXPECT_GT(soak::count_wrong_bytes(other, chunk.data(), chunk.size()), chunk.size() * 9 / 10);
}

TEST(SoakStampTest, LatencyBucketsHoldTheirTimes) {
  for (uint64_t ns : {2ull, 1000ull, 123456ull, 987654321ull}) {
    const double mid = soak::bucket_ns(soak::latency_bucket(ns));
    EXPECT_NEAR(mid / double(ns), 1.0, 0.05) << ns;
  }
  EXPECT_EQ(soak::latency_bucket(~0ull), soak::kBuckets - 1);
}

TEST(SoakBenchSmokeTest, KillsEnginesAndKdndAndServesNoWrongByte) {
  BenchRun run = run_bench("soak --json --seconds 30 --processes 2 --seed 7");
  ASSERT_EQ(run.exit_code, 0) << run.said();
  nlohmann::json j = nlohmann::json::parse(run.stdout_text, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << run.stdout_text;

  EXPECT_EQ(at(j, "wrong_bytes").get<uint64_t>(), 0u) << run.said();
  EXPECT_EQ(at(j, "wrong_chunks").get<uint64_t>(), 0u);
  EXPECT_EQ(at(j, "errors.unexpected").get<uint64_t>(), 0u) << at(j, "errors.unexpected_by_kind");
  EXPECT_GE(at(j, "kills.engine").get<uint64_t>(), 1u);
  EXPECT_GE(at(j, "kills.kdnd").get<uint64_t>(), 1u);
  EXPECT_EQ(at(j, "kdnd.lifetimes_count").get<uint64_t>(), at(j, "kills.kdnd").get<uint64_t>() + 1);
  EXPECT_GT(at(j, "ops.total").get<uint64_t>(), 0u);
  for (const char* op : {"store", "lookup", "lease", "release", "prefetch", "evict"}) {
    EXPECT_GT(at(j, std::string("ops.") + op).get<uint64_t>(), 0u) << op;
    EXPECT_TRUE(at(j, std::string("latency_us.") + op + ".p99").is_number()) << op;
  }
  EXPECT_GT(at(j, "verified.chunks").get<uint64_t>(), 0u);
  EXPECT_EQ(at(j, "kdnd.exit_after_sigterm").get<std::string>(), "exit 0");
  // Both quiesced samples of kdnd's last lifetime were taken and settled.
  EXPECT_TRUE(at(j, "kdnd.rss_anon_drift").is_number()) << at(j, "kdnd.drift_early") << at(j, "kdnd.drift_end");
  EXPECT_TRUE(at(j, "kdnd.fd_drift").is_number());
  for (const char* bar : {"wrong_bytes", "unexpected_errors", "rss_anon_drift", "fd_drift"})
    EXPECT_TRUE(at(j, std::string("bars.") + bar + ".pass").is_boolean()) << bar;
  EXPECT_TRUE(at(j, "bars.wrong_bytes.pass").get<bool>());
  EXPECT_TRUE(at(j, "bars.unexpected_errors.pass").get<bool>());
}

}  // namespace
