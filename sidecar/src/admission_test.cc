#include "admission.h"

#include "guaranteed_share.h"

#include <gtest/gtest.h>

namespace kdn::sidecar {
namespace {

TEST(PendingShare, TheUidHoldingTheMostGivesWayToOneHoldingAtLeastTwoFewer) {
  std::unordered_map<uint32_t, uint32_t> held{{1, 5}, {2, 3}};
  EXPECT_EQ(pending_to_give_way(held, 3), 1u) << "a newcomer";
  EXPECT_EQ(pending_to_give_way(held, 2), 1u) << "3 + 1 stays below 5";
  held[2] = 4;
  EXPECT_EQ(pending_to_give_way(held, 2), std::nullopt) << "they would only swap places";
  EXPECT_EQ(pending_to_give_way(held, 1), std::nullopt) << "the largest holder takes from nobody";
  EXPECT_EQ(pending_to_give_way({}, 1), std::nullopt);
}

std::map<std::string, std::unique_ptr<Namespace>> namespaces(std::initializer_list<uint32_t> sessions) {
  std::map<std::string, std::unique_ptr<Namespace>> m;
  int i = 0;
  for (uint32_t n : sessions) {
    auto ns = std::make_unique<Namespace>();
    ns->sessions = n;
    m.emplace("ns" + std::to_string(i++), std::move(ns));
  }
  return m;
}

TEST(GuaranteedShare, WithinTheGuaranteeAlwaysPastItOnlyBesideWhatOthersAreOwed) {
  EXPECT_TRUE(share_allows_one_more(1, 2, 8, 8, 8)) << "within: even a full table's share is its own";
  EXPECT_TRUE(share_allows_one_more(2, 2, 4, 3, 8)) << "4 + 1 + 3 = 8";
  EXPECT_FALSE(share_allows_one_more(2, 2, 5, 3, 8)) << "5 + 1 + 3 = 9";
  EXPECT_TRUE(share_allows_one_more(9, 0, 7, 0, 8)) << "no guarantee: first come, first served";
  EXPECT_FALSE(share_allows_one_more(9, 0, 8, 0, 8));
  EXPECT_EQ(still_owed(1, 4), 3u);
  EXPECT_EQ(still_owed(5, 4), 0u);
}

TEST(SessionShare, ANamespacePastItsGuaranteeLeavesTheOthersTheirs) {
  Config cfg;
  cfg.max_sessions = 8;
  cfg.sessions_reserved_per_namespace = 2;
  auto m = namespaces({3, 0, 1});  // 4 open; the second is owed 2, the third 1
  const Namespace& busy = *m.at("ns0");
  EXPECT_TRUE(session_share_allows(cfg, m, busy, 4).ok()) << "4 + 1 + 3 owed = 8";
  m.at("ns0")->sessions = 4;
  EXPECT_EQ(session_share_allows(cfg, m, busy, 5).code(), Code::kLimit);
  EXPECT_TRUE(session_share_allows(cfg, m, *m.at("ns1"), 5).ok()) << "within its own guarantee";
  m.at("ns1")->policy.max_sessions = 1;  // its own cap bounds what it is owed
  EXPECT_TRUE(session_share_allows(cfg, m, busy, 5).ok());
}

TEST(SessionShare, TheGuaranteeShrinksToAnEvenSplit) {
  Config cfg;
  cfg.max_sessions = 6;
  cfg.sessions_reserved_per_namespace = 16;
  EXPECT_EQ(sessions_reserved(cfg, 4), 1u);
  EXPECT_EQ(sessions_reserved(cfg, 1), 6u);
  cfg.sessions_reserved_per_namespace = 0;
  auto m = namespaces({5, 0});
  EXPECT_TRUE(session_share_allows(cfg, m, *m.at("ns0"), 5).ok()) << "0: first come, first served";
  EXPECT_EQ(session_share_allows(cfg, m, *m.at("ns0"), 6).code(), Code::kLimit) << "max_sessions";
}

TEST(WriterShare, TheWriterHoldingTheMostGivesWayWhileItStillHoldsMore) {
  Namespace ns;
  Session a, b, c;
  a.reserved_bytes = 10;
  b.reserved_bytes = 4;
  for (Session* s : {&a, &b, &c}) ns.writers.insert(s);
  EXPECT_EQ(writer_to_give_way(ns, c, 1), &a) << "a newcomer takes from the largest";
  EXPECT_EQ(writer_to_give_way(ns, b, 5), &a) << "4 + 5 stays below 10";
  EXPECT_EQ(writer_to_give_way(ns, b, 6), nullptr) << "they would only swap places";
  EXPECT_EQ(writer_to_give_way(ns, a, 1), nullptr) << "the largest takes from nobody";
  ns.writers.erase(&a);
  EXPECT_EQ(writer_to_give_way(ns, c, 1), &b) << "only sessions of the namespace count";
}

}  // namespace
}  // namespace kdn::sidecar
