// Leases against a tenant's writers: leased chunks cannot be evicted, so a session that leased
// its namespace's whole arena made every store there NO_SPACE for as long as it lived. A session
// now leases at most max_lease_bytes; past it the lease is refused whole (KDN_ERR_LIMIT) and the
// writers keep the rest of the arena; the welcome tells the session its cap. Reservations pin their slots too: a
// session that reserved the whole arena (and re-reserved whatever expired) kept every other writer out; now the writer
// holding the most reserved bytes gives up its oldest reservation to one holding fewer. Runs the real kdnd binary.
#include "kdnd_process.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

namespace kdn::testing {
namespace {

constexpr uint32_t kDocChunks = 64;

// Leases the cached prefix of `doc` and keeps it: the status.
int hold_doc(Conn& k, uint32_t doc, std::vector<kdn_lease*>* held) {
  auto tok = doc_tokens(doc, size_t(kDocChunks) * kdn_model_chunk_tokens(k.m));
  kdn_lease* l = nullptr;
  const int rc = kdn_retrieve_lease(k.c, k.m, tok.data(), tok.size(), 0, &l);
  if (rc == KDN_OK) {
    if (kdn_lease_chunks(l) != kDocChunks) return -1;
    held->push_back(l);
  }
  return rc;
}

// Reserves documents of `doc_tokens_n` tokens until the arena is full; the reservations held.
std::vector<kdn_store*> reserve_until_full(Conn& hog, size_t doc_tokens_n) {
  std::vector<kdn_store*> held;
  int refused = KDN_OK;
  for (uint32_t doc = 1000; doc < 1100 && refused == KDN_OK; ++doc) {
    auto tok = doc_tokens(doc, doc_tokens_n);
    kdn_store* st = nullptr;
    refused = kdn_store_reserve(hog.c, hog.m, tok.data(), tok.size(), 0, kDocChunks, &st);
    if (refused == KDN_OK) held.push_back(st);
  }
  EXPECT_EQ(refused, KDN_ERR_NO_SPACE) << "the hog filled the arena";
  return held;
}

TEST(LeaseQuota, ASessionCannotPinTheWholeArenaAgainstItsWriters) {
  // A 32 MiB arena, 1 MiB documents (64 chunks of 16 KiB), 16 MiB of leases per session.
  KdndProcess d({"--set", "tier.host.bytes=32M", "--set", "max_lease_bytes=16M"});
  Conn writer(d, tiny_model()), reader(d, tiny_model());
  ASSERT_TRUE(writer.ok() && reader.ok());
  ASSERT_EQ(kdn_model_chunk_bytes(writer.m), 16384u);
  // The welcome says the cap, so a client can size its leases before a refusal tells it.
  kdn_session_info info{};
  info.struct_size = sizeof info;
  ASSERT_EQ(kdn_get_session_info(reader.c, &info), KDN_OK);
  EXPECT_EQ(info.max_lease_bytes, 16u << 20);
  // A caller built before the field came passes the older size and gets the fields it knows.
  struct {
    kdn_session_info info;
    uint64_t beyond;
  } older{};
  older.info.struct_size = offsetof(kdn_session_info, max_lease_bytes);
  older.info.max_lease_bytes = older.beyond = 77;
  ASSERT_EQ(kdn_get_session_info(reader.c, &older.info), KDN_OK);
  EXPECT_EQ(older.info.max_leases, info.max_leases);
  EXPECT_EQ(older.info.max_lease_bytes, 77u) << "past the caller's struct_size nothing is written";
  for (uint32_t doc = 0; doc < 32; ++doc) ASSERT_EQ(store_doc(writer, doc, kDocChunks), int(kDocChunks)) << doc;
  // The reader leases every document it can and keeps them.
  std::vector<kdn_lease*> held;
  int refused = KDN_OK;
  for (uint32_t doc = 0; doc < 32 && refused == KDN_OK; ++doc) refused = hold_doc(reader, doc, &held);
  EXPECT_EQ(held.size(), 16u) << "16 MiB of leases";
  EXPECT_EQ(refused, KDN_ERR_LIMIT) << "the 17th document's lease is refused whole";
  // The writers still have the other half of the arena: 32 MiB of new documents go in.
  for (uint32_t doc = 100; doc < 132; ++doc) EXPECT_EQ(store_doc(writer, doc, kDocChunks), int(kDocChunks)) << doc;
  // And what the reader holds was never evicted under it.
  for (size_t i = 0; i < held.size(); ++i) {
    for (uint32_t c = 0; c < kDocChunks; ++c)
      ASSERT_TRUE(check_chunk(kdn_lease_chunk_data(held[i], c), 16384, uint32_t(i), c)) << i << "/" << c;
    EXPECT_EQ(kdn_lease_release(reader.c, held[i]), KDN_OK);
  }
  // Released, the reader may lease again.
  EXPECT_EQ(verify_doc(reader, 131, kDocChunks), int(kDocChunks));
}

TEST(LeaseQuota, AWriterHoldingTheArenaInReservationsGivesWay) {
  // A 16 MiB arena: 1024 chunks of 16 KiB. The hog reserves documents until the arena is full
  // and commits nothing; the writer's 16 documents still go in.
  KdndProcess d({"--set", "tier.host.bytes=16M"});
  Conn hog(d, tiny_model()), writer(d, tiny_model());
  ASSERT_TRUE(hog.ok() && writer.ok());
  const size_t doc_tokens_n = size_t(kDocChunks) * kdn_model_chunk_tokens(hog.m);
  std::vector<kdn_store*> held = reserve_until_full(hog, doc_tokens_n);
  ASSERT_GE(held.size(), 8u);
  int served = 0;
  for (uint32_t doc = 0; doc < 16; ++doc) served += store_doc(writer, doc, kDocChunks) == int(kDocChunks);
  EXPECT_EQ(served, 16) << "stores the writer got through, of 16";
  EXPECT_EQ(verify_doc(writer, 15, kDocChunks), int(kDocChunks));
  // The hog's oldest reservations went to the writer: committing them says their handles are
  // gone; its newest are still its own.
  EXPECT_EQ(kdn_store_commit(hog.c, held.front()), KDN_ERR_NOT_FOUND);
  EXPECT_EQ(kdn_store_abort(hog.c, held.back()), KDN_OK);
  for (size_t i = 1; i + 1 < held.size(); ++i) (void)kdn_store_abort(hog.c, held[i]);
}

TEST(LeaseQuota, AWriterOfLargerChunksGetsRoomFromAHolderOfSmallerOnes) {
  // A 16 MiB arena of 1 MiB slabs. The hog's 16 KiB chunks fill all 16 slabs (one document a
  // slab); the writer's chunks are 32 KiB, so a slab must empty whole before one of them fits:
  // the hog gives up 64 reservations for the writer's first chunk, not a fixed few.
  KdndProcess d({"--set", "tier.host.bytes=16M", "--set", "tier.host.slab_bytes=1M"});
  Conn hog(d, tiny_model(16)), writer(d, tiny_model(32));
  ASSERT_TRUE(hog.ok() && writer.ok());
  ASSERT_EQ(kdn_model_chunk_bytes(writer.m), 2 * kdn_model_chunk_bytes(hog.m));
  const size_t doc_tokens_n = size_t(kDocChunks) * kdn_model_chunk_tokens(hog.m);
  std::vector<kdn_store*> held = reserve_until_full(hog, doc_tokens_n);
  ASSERT_EQ(held.size(), 16u);
  // Each writer document is 32 chunks of 32 KiB: one slab.
  int served = 0;
  for (uint32_t doc = 0; doc < 6; ++doc) served += store_doc(writer, doc, 32) == 32;
  EXPECT_EQ(served, 6) << "stores the writer got through, of 6";
  EXPECT_EQ(verify_doc(writer, 5, 32), 32);
  EXPECT_EQ(kdn_store_abort(hog.c, held.back()), KDN_OK) << "the hog keeps its newest";
  for (size_t i = 0; i + 1 < held.size(); ++i) (void)kdn_store_abort(hog.c, held[i]);
}

// The review's timed client: a hog that re-reserves on a timer whatever it lost (expired, or
// given to a writer), so the arena stays full of its reservations, beside a writer storing
// documents at a steady pace. Before fair room-making the writer got 97 of 386 stores through
// in the review, 304 of 3,098 here (20 s, room-making taken out).
// KDN_TIMED_HOG_SECONDS sets the length (2 s by default).
TEST(LeaseQuota, AWriterBesideATimedReReservingHogGetsEveryStoreThrough) {
  const char* env = std::getenv("KDN_TIMED_HOG_SECONDS");
  const double seconds = env ? std::atof(env) : 2.0;
  KdndProcess d({"--set", "tier.host.bytes=16M", "--set", "reservation_timeout_ms=200"});
  Conn hog(d, tiny_model()), writer(d, tiny_model());
  ASSERT_TRUE(hog.ok() && writer.ok());
  const size_t doc_tokens_n = size_t(kDocChunks) * kdn_model_chunk_tokens(hog.m);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> hog_reserves{0};
  std::thread hogging([&] {
    std::vector<kdn_store*> held;
    for (uint32_t doc = 1000; !stop.load();) {
      auto tok = doc_tokens(doc, doc_tokens_n);
      kdn_store* st = nullptr;
      if (kdn_store_reserve(hog.c, hog.m, tok.data(), tok.size(), 0, kDocChunks, &st) == KDN_OK) {
        held.push_back(st);
        ++doc;
        ++hog_reserves;
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));  // the timer
      }
    }
    for (kdn_store* st : held) (void)kdn_store_abort(hog.c, st);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the arena is full of the hog's
  int served = 0, tried = 0;
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  for (uint32_t doc = 0; std::chrono::steady_clock::now() < end; ++doc, ++tried) {
    served += store_doc(writer, doc, kDocChunks) == int(kDocChunks);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  stop = true;
  hogging.join();
  std::printf("timed hog: %d of %d stores served in %.1f s; the hog reserved %llu documents\n", served, tried, seconds,
              (unsigned long long)hog_reserves.load());
  EXPECT_GE(hog_reserves.load(), 16u) << "the hog kept the arena full";
  EXPECT_GT(tried, 0);
  // Room is shared evenly, not handed to the writer: when the hog's reservations have just
  // expired together, it holds less than the writer and takes a reservation from it (a few
  // stores in a thousand). Without room-making the writer got 1 store in 10.
  EXPECT_GE(served * 10, tried * 9) << "stores the writer got through";
}

}  // namespace
}  // namespace kdn::testing
