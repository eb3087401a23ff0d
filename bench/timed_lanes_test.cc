#include "timed_lanes.h"

#include "process.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

namespace kdn::bench {
namespace {

// Records the order of its calls; fails the check of one method if asked to.
class RecordingLane final : public Lane {
 public:
  explicit RecordingLane(int failing_method = -1) : failing_(failing_method) {}
  void prepare() override { calls.push_back("prepare"); }
  void reset(int m) override { calls.push_back("reset " + std::to_string(m)); }
  void run(int m) override {
    calls.push_back("run " + std::to_string(m));
    ran.push_back(m);
  }
  bool check(int m) override {
    calls.push_back("check " + std::to_string(m));
    return m != failing_;
  }
  std::vector<std::string> calls;
  std::vector<int> ran;

 private:
  int failing_;
};

TEST(TimedLanesTest, RotatesTheMethodsAndTimesEveryStep) {
  RecordingLane a, b;
  Lane* lanes[] = {&a, &b};
  Result<MethodSamples> r = run_timed_lanes(lanes, 3, 4);
  ASSERT_TRUE(r.ok()) << describe(r.status());
  ASSERT_EQ(r->size(), 3u);
  for (const std::vector<uint64_t>& per_method : *r) EXPECT_EQ(per_method.size(), 4u);
  EXPECT_EQ(a.ran, (std::vector<int>{0, 1, 2, 1, 2, 0, 2, 0, 1, 0, 1, 2}));
  EXPECT_EQ(b.ran, a.ran);
  ASSERT_GE(a.calls.size(), 4u);
  EXPECT_EQ(a.calls[0], "prepare");
  EXPECT_EQ(a.calls[1], "reset 0");
  EXPECT_EQ(a.calls[2], "run 0");
  EXPECT_EQ(a.calls[3], "check 0");
}

TEST(TimedLanesTest, AFailedCheckFailsTheRun) {
  RecordingLane good, bad(/*failing_method=*/1);
  Lane* lanes[] = {&good, &bad};
  EXPECT_EQ(run_timed_lanes(lanes, 2, 2).status().code(), Code::kInternal);
}

TEST(TimedLanesTest, RejectsEmptyRuns) {
  RecordingLane a;
  Lane* lanes[] = {&a};
  EXPECT_EQ(run_timed_lanes({}, 1, 1).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(run_timed_lanes(lanes, 0, 1).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(run_timed_lanes(lanes, 1, 0).status().code(), Code::kInvalidArgument);
}

TEST(RateSpreadTest, MedianMinAndMax) {
  // 1000 bytes in 100, 200 and 400 ns: 10, 5 and 2.5 GB/s.
  RateSpread s = rate_spread({200, 100, 400}, 1000);
  EXPECT_DOUBLE_EQ(s.median_gbps, 5.0);
  EXPECT_DOUBLE_EQ(s.min_gbps, 2.5);
  EXPECT_DOUBLE_EQ(s.max_gbps, 10.0);
  EXPECT_DOUBLE_EQ(rate_spread({}, 1000).median_gbps, 0.0);
}

TEST(PairedRatioTest, ComparesRoundByRound) {
  // a takes twice b's time in every round, whatever the round's own speed: ratio 0.5.
  EXPECT_DOUBLE_EQ(paired_ratio({200, 1000, 60}, {100, 500, 30}), 0.5);
  EXPECT_DOUBLE_EQ(paired_ratio({}, {}), 0.0);
}

TEST(StreamZeroTest, ZeroesEveryByteOfUnalignedRanges) {
  std::vector<unsigned char> buf(4096 + 64);
  for (size_t off : {0, 1, 15, 16, 33}) {
    for (size_t n : {0, 1, 15, 16, 17, 255, 4000}) {
      std::fill(buf.begin(), buf.end(), 0xAB);
      stream_zero(buf.data() + off, n);
      for (size_t i = 0; i < buf.size(); ++i) {
        const bool inside = i >= off && i < off + n;
        ASSERT_EQ(buf[i], inside ? 0 : 0xAB) << "off " << off << " n " << n << " at " << i;
      }
    }
  }
}

}  // namespace
}  // namespace kdn::bench
