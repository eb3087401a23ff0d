// End to end: kdn-bench llama with its default model (the one setup-llama.sh unpacked) and
// this build's kdnd, on a one-chunk prompt.
// Checks that every figure is there, that each summary is computed from the runs the report
// lists (medians, paired ratios, counts, bars), and that the f16-weight codec run is the one
// the top-1 bar reads. Does not judge the figures themselves (that is the benchmark's job).
#include "smoke_util.h"
#include "stats.h"

#include <algorithm>
#include <vector>

namespace {

using kdn::bench::smoke::at;
using kdn::bench::smoke::BenchRun;
using kdn::bench::smoke::run_bench;

using kdn::bench::median;

TEST(LlamaBenchSmokeTest, ReportsWhatItsRunsMeasured) {
  BenchRun run = run_bench(
      "llama --json --sizes 256 --reps 4 --pair-seconds 0 --warmup 1 --eval-tokens 16 --n-predict 8 --no-calibrate "
      "--disk-size 512 --disk-reps 2");
  ASSERT_EQ(run.exit_code, 0) << run.said();
  nlohmann::json j = nlohmann::json::parse(run.stdout_text, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << run.stdout_text;

  const std::string p = "prompt_256.";
  const auto hit = at(j, p + "ttft_hit_runs_s").get<std::vector<double>>();
  const auto slot = at(j, p + "ttft_slot_restore_runs_s").get<std::vector<double>>();
  ASSERT_EQ(hit.size(), 4u);
  ASSERT_EQ(slot.size(), 4u);
  EXPECT_EQ(at(j, p + "warmup_hit_runs_s").size(), 1u);
  EXPECT_EQ(at(j, p + "warmup_slot_restore_runs_s").size(), 1u);
  EXPECT_EQ(at(j, p + "pairs").get<uint64_t>(), 4u);
  EXPECT_DOUBLE_EQ(at(j, p + "ttft_hit_s").get<double>(), median(hit));
  EXPECT_DOUBLE_EQ(at(j, p + "ttft_slot_restore_s").get<double>(), median(slot));
  std::vector<double> ratio;
  uint64_t faster = 0;
  for (size_t i = 0; i < hit.size(); ++i) {
    EXPECT_GT(hit[i], 0.0);
    ratio.push_back(hit[i] / slot[i]);
    faster += hit[i] < slot[i];
  }
  EXPECT_DOUBLE_EQ(at(j, p + "hit_vs_slot_restore").get<double>(), median(ratio));
  EXPECT_DOUBLE_EQ(at(j, p + "hit_vs_slot_restore_of_medians").get<double>(), median(hit) / median(slot));
  // Four pairs (an even count: a median is the mean of the middle two) are too few for a 95%
  // interval of the median: it is their whole range.
  const auto ci = at(j, p + "hit_vs_slot_restore_ci95").get<std::vector<double>>();
  ASSERT_EQ(ci.size(), 2u);
  EXPECT_DOUBLE_EQ(ci[0], *std::min_element(ratio.begin(), ratio.end()));
  EXPECT_DOUBLE_EQ(ci[1], *std::max_element(ratio.begin(), ratio.end()));
  EXPECT_EQ(at(j, p + "hit_faster_pairs").get<uint64_t>(), faster);
  EXPECT_DOUBLE_EQ(at(j, "bars.hit_vs_slot_restore_256.value").get<double>(), median(ratio));
  EXPECT_DOUBLE_EQ(at(j, p + "speedup").get<double>(),
                   at(j, p + "ttft_miss_s").get<double>() / at(j, p + "ttft_hit_s").get<double>());

  EXPECT_TRUE(at(j, p + "tokens_identical").get<bool>());
  EXPECT_TRUE(at(j, p + "slot_tokens_identical").get<bool>());
  EXPECT_EQ(at(j, p + "tokens_reused").get<uint64_t>(), 256u);

  // Both weights scored; the bar reads the f16 copy's, where the one-ulp control barely moves
  // the next-token distributions while on the 8-bit activations of the served weights it does.
  for (const char* w : {"codec.", "codec_f16."}) {
    EXPECT_EQ(at(j, p + w + "eval_tokens").get<uint64_t>(), 16u) << w;
    const double top1 = at(j, p + w + "top1_agreement").get<double>();
    EXPECT_GE(top1, 0.0) << w;
    EXPECT_LE(top1, 1.0) << w;
    EXPECT_DOUBLE_EQ(at(j, std::string(w) + "top1_agreement").get<double>(), top1) << w;
    EXPECT_EQ(at(j, std::string(w) + "scored_positions").get<uint64_t>(), 16u) << w;
    // The pooled figure's 95% interval is Wilson's for its agreeing positions of the 16.
    const auto agreeing = static_cast<uint64_t>(top1 * 16 + 0.5);
    const kdn::bench::Interval want = kdn::bench::proportion_interval(agreeing, 16);
    const auto ci = at(j, std::string(w) + "top1_agreement_ci95").get<std::vector<double>>();
    ASSERT_EQ(ci.size(), 2u) << w;
    EXPECT_DOUBLE_EQ(ci[0], want.lo) << w;
    EXPECT_DOUBLE_EQ(ci[1], want.hi) << w;
    EXPECT_LE(ci[0], top1) << w;
    EXPECT_GE(ci[1], top1) << w;
  }
  EXPECT_LT(at(j, p + "codec_f16.floor_kl").get<double>(), at(j, p + "codec.floor_kl").get<double>());
  EXPECT_DOUBLE_EQ(at(j, "bars.codec_top1_agreement.value").get<double>(),
                   at(j, "codec_f16.top1_agreement").get<double>());

  // The disk-tier hits (a prompt larger than the others: the arena must hold it too).
  const std::string d = "prompt_512.";
  const auto disk = at(j, d + "ttft_disk_hit_runs_s").get<std::vector<double>>();
  const auto arena = at(j, d + "ttft_arena_hit_request_runs_s").get<std::vector<double>>();
  ASSERT_EQ(disk.size(), 2u);
  ASSERT_EQ(arena.size(), 2u);
  EXPECT_DOUBLE_EQ(at(j, d + "ttft_disk_hit_s").get<double>(), median(disk));
  EXPECT_DOUBLE_EQ(at(j, d + "disk_hit_vs_hit").get<double>(), median({disk[0] / arena[0], disk[1] / arena[1]}));
  EXPECT_GT(at(j, d + "disk_promoted_chunks").get<uint64_t>(), 0u);
  EXPECT_TRUE(at(j, d + "disk_tokens_identical").get<bool>());
}

TEST(LlamaBenchSmokeTest, SizesOffTheChunkGridAreAUsageError) {
  BenchRun run = run_bench("llama --json --sizes 300");
  EXPECT_EQ(run.exit_code, 2);
}

}  // namespace
