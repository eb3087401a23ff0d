// codec = auto's choice at fixed rates: a slow link pays for kivi4, a fast disk pays for none,
// unmeasured codecs are no candidates, and the margin keeps a near tie on none.
#include "codec_choice.h"

#include <gtest/gtest.h>

namespace kdn::sidecar {
namespace {

// Rates of the order measured on two cores (docs/codec.md): kivi4 encodes ~2, decodes ~4 GB/s.
std::array<CodecRate, kChoiceCodecs> rates() {
  std::array<CodecRate, kChoiceCodecs> r{};
  r[1] = {0.5, 0.8, 1.3};  // lossless
  r[2] = {2.0, 4.0, 1.9};  // int8
  r[3] = {2.0, 4.0, 3.7};  // kivi4
  return r;
}

TEST(CodecChoice, SlowLinkPicksKivi4) {
  const CodecChoice c = choose_codec(rates(), 0.125);  // 1 Gbit/s
  EXPECT_EQ(c.codec_id, 3);
  EXPECT_LT(c.seconds_per_gb[3], c.seconds_per_gb[0]);
  EXPECT_NE(c.why.find("chose kivi4"), std::string::npos) << c.why;
  EXPECT_NE(c.why.find("none 8.0000"), std::string::npos) << c.why;
}

TEST(CodecChoice, FastDiskPicksNone) {
  const CodecChoice c = choose_codec(rates(), 3.5);
  EXPECT_EQ(c.codec_id, 0);
  EXPECT_GT(c.seconds_per_gb[3], c.seconds_per_gb[0]);
  EXPECT_NE(c.why.find("chose none"), std::string::npos) << c.why;
}

TEST(CodecChoice, UnmeasuredCodecsAreNoCandidates) {
  std::array<CodecRate, kChoiceCodecs> r{};
  r[4] = {1.0, 0.0, 6.0};  // transform with no measured decode rate
  const CodecChoice c = choose_codec(r, 0.01);
  EXPECT_EQ(c.codec_id, 0);
  EXPECT_EQ(c.seconds_per_gb[4], 0.0);
  EXPECT_EQ(choose_codec(rates(), 0.0).codec_id, 0);
}

TEST(CodecChoice, MarginKeepsNearTiesOnNone) {
  std::array<CodecRate, kChoiceCodecs> r{};
  // 1/10 + 1/(2*1) + 1/10 = 0.7 s against none's 1/1 = 1.0 s at 1 GB/s: pays.
  r[2] = {10.0, 10.0, 2.0};
  EXPECT_EQ(choose_codec(r, 1.0).codec_id, 2);
  // Same codec at 1.5 GB/s: 0.2 + 0.333 = 0.533 against 0.667, 20% better: still pays.
  EXPECT_EQ(choose_codec(r, 1.5).codec_id, 2);
  // At 1.9 GB/s: 0.2 + 0.263 = 0.463 against 0.526, inside a 15% margin: none.
  EXPECT_EQ(choose_codec(r, 1.9, 0.15).codec_id, 0);
}

}  // namespace
}  // namespace kdn::sidecar
