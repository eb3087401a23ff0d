// The event loop's pieces on their own: the epoll tags that say what woke the loop, the tier
// wake ids that name a namespace's tier fd, the log limiter for refusals, and which requests
// still finish after their session closed.
#include "daemon_impl.h"

#include <gtest/gtest.h>

#include <set>

namespace kdn::sidecar {
namespace {

using namespace daemon_detail;

TEST(LoopTags, KindAndIdRoundTrip) {
  const TagKind kinds[] = {kListen, kSignal, kStop, kHandshake, kSocket, kBell, kTierWake, kScrape, kGpuWake};
  const uint64_t ids[] = {0, 1, 42, (1ull << 32) + 7, (1ull << 56) - 1};
  for (TagKind k : kinds)
    for (uint64_t id : ids) {
      const uint64_t t = tag(k, id);
      EXPECT_EQ(tag_kind(t), k);
      EXPECT_EQ(tag_id(t), id);
    }
}

TEST(LoopTags, AnIdWiderThanItsFieldCannotChangeTheKind) {
  // Session ids and fds only grow; a huge one must never read back as another kind of fd.
  const uint64_t t = tag(kBell, ~0ull);
  EXPECT_EQ(tag_kind(t), kBell);
  EXPECT_EQ(tag_id(t), (1ull << 56) - 1);
}

TEST(LoopTags, EveryKindIsDistinctAndNonZero) {
  // Tag 0 would be an epoll_event whose data was never set.
  std::set<uint64_t> seen;
  for (TagKind k : {kListen, kSignal, kStop, kHandshake, kSocket, kBell, kTierWake, kScrape, kGpuWake}) {
    EXPECT_NE(tag(k, 0), 0u);
    EXPECT_TRUE(seen.insert(tag(k, 0)).second);
  }
}

TEST(TierWakeIds, RegionTierAndFdRoundTrip) {
  std::set<uint64_t> seen;
  for (uint32_t region : {1u, 2u, 1000u, (1u << 29) - 1})
    for (uint32_t t = tier_index(TierId::kHost); t < kTierCount; ++t)
      for (TierFd which : {TierFd::kWake, TierFd::kPoll}) {
        const uint64_t id = wake_id(region, TierId(t), which);
        EXPECT_EQ(wake_region(id), region);
        EXPECT_EQ(wake_tier(id), TierId(t));
        EXPECT_EQ(wake_which(id), which);
        EXPECT_TRUE(seen.insert(id).second) << "region " << region << " tier " << t;
        // And through the epoll tag it travels in.
        EXPECT_EQ(tag_id(tag(kTierWake, id)), id);
      }
}

TEST(RefusalLog, AllowsFiveLinesASecondAndCountsTheRest) {
  LogLimiter lim;
  const uint64_t t0 = 10'000'000'000;
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(lim.allow(t0 + i));
  for (int i = 0; i < 7; ++i) EXPECT_FALSE(lim.allow(t0 + 100 + i));
  // The next window's first line says how many were held back, once.
  EXPECT_TRUE(lim.allow(t0 + 1'000'000'000));
  EXPECT_EQ(lim.suppressed_note(), " (7 more not logged)");
  EXPECT_EQ(lim.suppressed_note(), "");
}

TEST(RefusalLog, ANewWindowStartsWhereTheLastLineWas) {
  LogLimiter lim;
  const uint64_t t0 = 5'000'000'000;
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(lim.allow(t0));
  EXPECT_FALSE(lim.allow(t0 + 999'999'999));
  EXPECT_TRUE(lim.allow(t0 + 1'000'000'000));
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(lim.allow(t0 + 1'000'000'001));
  EXPECT_FALSE(lim.allow(t0 + 1'000'000'002));
}

Op op_of(ipc::Opcode code) {
  Op op;
  op.sqe.opcode = uint16_t(code);
  return op;
}

TEST(SettlesAfterClose, CommitAndGpuStoreFinishTheCopiesTheyMade) {
  EXPECT_TRUE(settles_after_close(op_of(ipc::Opcode::kCommit)));
  EXPECT_TRUE(settles_after_close(op_of(ipc::Opcode::kGpuStore)));
}

TEST(SettlesAfterClose, ReadsAndUnknownOpcodesAreDropped) {
  EXPECT_FALSE(settles_after_close(op_of(ipc::Opcode::kLookup)));
  EXPECT_FALSE(settles_after_close(op_of(ipc::Opcode::kLookupEach)));
  EXPECT_FALSE(settles_after_close(op_of(ipc::Opcode(0xfff))));
}

}  // namespace
}  // namespace kdn::sidecar
