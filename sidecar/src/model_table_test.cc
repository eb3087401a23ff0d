#include "model_table.h"

#include <kdn/common/model_presets.h>

#include <gtest/gtest.h>

namespace kdn::sidecar {
namespace {

// Model `n`: the same shape, a fingerprint of its own (the engine salt differs).
ModelInfo model(uint8_t n) {
  kdn_model_desc d = shaped_desc(2, 2, 64, 16, "test-model");
  d.engine_salt[0] = n;
  return *ModelInfo::from_desc(d);
}

constexpr uint32_t kUid = 1000, kA = 1, kB = 2, kC = 3;

TEST(ModelTableShares, EachOpenGroupKeepsItsGuarantee) {
  ModelTable t(8, ModelTable::kNoHolder, 64);  // 2 groups: 4 each (8 / 2 caps the 64)
  t.open_group(kA);
  t.open_group(kB);
  EXPECT_EQ(t.reserved_per_group(), 4u);
  for (uint8_t n = 1; n <= 4; ++n) EXPECT_TRUE(t.acquire(model(n), kUid, kA).ok()) << int(n);
  EXPECT_EQ(t.acquire(model(5), kUid, kA).status().code(), Code::kLimit) << "B's 4 are owed";
  EXPECT_TRUE(t.acquire(model(1), kUid + 1, kB).ok()) << "a model A holds takes no slot";
  for (uint8_t n = 11; n <= 13; ++n) EXPECT_TRUE(t.acquire(model(n), kUid, kB).ok()) << int(n);
  EXPECT_EQ(t.held_by_group(kB), 4u);
  EXPECT_EQ(t.live(), 7u);
  // The last slot is B's: the model B shares with A counts for B as well, and B may let go of it.
  EXPECT_EQ(t.acquire(model(6), kUid, kA).status().code(), Code::kLimit) << "B may still need the last slot";
  t.release(t.id_of(model(1).fingerprint), kUid + 1, kB);
  EXPECT_EQ(t.live(), 7u) << "A still holds model 1";
  EXPECT_TRUE(t.acquire(model(14), kUid, kB).ok()) << "B's fourth";
  EXPECT_EQ(t.acquire(model(6), kUid, kA).status().code(), Code::kLimit) << "the table is full";
}

TEST(ModelTableShares, JoiningAnotherGroupsModelPastTheGuaranteeIsChargedAsANewSlot) {
  ModelTable t(8, ModelTable::kNoHolder, 64);  // 4 each
  t.open_group(kA);
  t.open_group(kB);
  for (uint8_t n = 1; n <= 4; ++n) ASSERT_TRUE(t.acquire(model(n), kUid, kA).ok()) << int(n);
  for (uint8_t n = 11; n <= 14; ++n) ASSERT_TRUE(t.acquire(model(n), kUid + 1, kB).ok()) << int(n);
  // Were B to hold model 1 too, A letting go of its four would free three slots: A would be
  // owed four and get three.
  EXPECT_EQ(t.acquire(model(1), kUid + 1, kB).status().code(), Code::kLimit) << "B is past its guarantee";
  EXPECT_TRUE(t.acquire(model(1), kUid + 2, kA).ok()) << "another uid of A: A holds it already";
  for (uint8_t n = 1; n <= 4; ++n) {
    t.release(t.id_of(model(n).fingerprint), kUid, kA);
    if (n == 1) t.release(t.id_of(model(n).fingerprint), kUid + 2, kA);
  }
  for (uint8_t n = 5; n <= 8; ++n) EXPECT_TRUE(t.acquire(model(n), kUid, kA).ok()) << "A's guarantee, " << int(n);
}

TEST(ModelTableShares, ASharedModelWithinBothGuaranteesIsFree) {
  ModelTable t(4, ModelTable::kNoHolder, 2);
  t.open_group(kA);
  t.open_group(kB);
  ASSERT_TRUE(t.acquire(model(1), kUid, kA).ok());
  EXPECT_TRUE(t.acquire(model(1), kUid + 1, kB).ok()) << "within B's guarantee";
  EXPECT_EQ(t.held_by_group(kA), 1u);
  EXPECT_EQ(t.held_by_group(kB), 1u);
  EXPECT_EQ(t.live(), 1u);
  EXPECT_TRUE(t.acquire(model(2), kUid, kA).ok());
  EXPECT_TRUE(t.acquire(model(3), kUid + 1, kB).ok());
  EXPECT_EQ(t.acquire(model(4), kUid, kA).status().code(), Code::kLimit)
      << "3 live, but A and B hold 2 each of 4: the fourth slot is what B's share of model 1 may need";
}

TEST(ModelTableShares, AGroupAloneMayFillTheTableAndAClosedOneIsOwedNothing) {
  ModelTable t(8, ModelTable::kNoHolder, 64);
  t.open_group(kA);
  for (uint8_t n = 1; n <= 8; ++n) EXPECT_TRUE(t.acquire(model(n), kUid, kA).ok()) << int(n);
  for (uint8_t n = 1; n <= 8; ++n) t.release(t.id_of(model(n).fingerprint), kUid, kA);
  EXPECT_EQ(t.live(), 0u);
  t.open_group(kB);
  t.open_group(kC);
  EXPECT_EQ(t.reserved_per_group(), 2u);  // 8 / 3
  for (uint8_t n = 1; n <= 4; ++n) EXPECT_TRUE(t.acquire(model(n), kUid, kA).ok()) << int(n);
  EXPECT_EQ(t.acquire(model(5), kUid, kA).status().code(), Code::kLimit) << "B's and C's 2 each";
  t.close_group(kC);
  EXPECT_EQ(t.reserved_per_group(), 4u);  // 8 / 2
  EXPECT_EQ(t.acquire(model(5), kUid, kA).status().code(), Code::kLimit) << "B's 4";
  t.close_group(kB);
  EXPECT_TRUE(t.acquire(model(5), kUid, kA).ok());
}

TEST(ModelTableShares, ReleasingGivesTheShareBack) {
  ModelTable t(4, ModelTable::kNoHolder, 2);
  t.open_group(kA);
  t.open_group(kB);
  auto a1 = t.acquire(model(1), kUid, kA), a2 = t.acquire(model(2), kUid, kA);
  ASSERT_TRUE(a1.ok() && a2.ok());
  EXPECT_EQ(t.acquire(model(3), kUid, kA).status().code(), Code::kLimit);
  t.release(*a2, kUid, kA);
  EXPECT_EQ(t.held_by_group(kA), 1u);
  EXPECT_TRUE(t.acquire(model(3), kUid, kA).ok());
  EXPECT_EQ(t.held_by(kUid), 2u);
}

}  // namespace
}  // namespace kdn::sidecar
