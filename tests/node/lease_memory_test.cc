// The daemon memory leases cost: each (session, chunk) pin is ~100 bytes of kdnd's bookkeeping.
// One uid's sessions together hold at most max_leases_per_uid pins, all sessions together at
// most max_leases_total, and what disconnected sessions held goes back to the kernel, not only
// to malloc. Runs the real kdnd binary; the daemon-wide case acts as other uids (root only).
#include "kdnd_process.h"

#include <gtest/gtest.h>
#include <kdn/common/testing/require.h>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace kdn::testing {
namespace {

constexpr uint32_t kDocChunks = 4000;  // within max_reservations per store

// Leases document `doc` and keeps it: the status.
int hold_doc(Conn& k, uint32_t doc, uint32_t n, std::vector<kdn_lease*>* held) {
  auto tok = doc_tokens(doc, size_t(n) * kdn_model_chunk_tokens(k.m));
  kdn_lease* l = nullptr;
  const int rc = kdn_retrieve_lease(k.c, k.m, tok.data(), tok.size(), 0, &l);
  if (rc == KDN_OK) {
    if (kdn_lease_chunks(l) != n) return -1;
    held->push_back(l);
  }
  return rc;
}

// kdnd's private memory (RssAnon, KiB; the arenas are shared memory and do not count).
long rss_anon_kib(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string key;
  long v = -1;
  while (f >> key) {
    if (key == "RssAnon:") {
      f >> v;
      return v;
    }
    f.ignore(1 << 12, '\n');
  }
  return -1;
}

TEST(LeaseMemory, OneUidsSessionsHoldAtMostMaxLeasesPerUid) {
  KdndProcess d({"--set", "max_leases_per_uid=1000"});
  Conn a(d, tiny_model()), b(d, tiny_model());
  ASSERT_TRUE(a.ok() && b.ok());
  for (uint32_t doc = 0; doc < 3; ++doc) ASSERT_EQ(store_doc(a, doc, 300), 300);
  std::vector<kdn_lease*> held_a, held_b;
  EXPECT_EQ(hold_doc(a, 0, 300, &held_a), KDN_OK);
  EXPECT_EQ(hold_doc(a, 1, 300, &held_a), KDN_OK);
  EXPECT_EQ(hold_doc(b, 0, 300, &held_b), KDN_OK) << "900 pins of the uid";
  EXPECT_EQ(hold_doc(b, 2, 300, &held_b), KDN_ERR_LIMIT) << "1200 > 1000: refused whole";
  for (kdn_lease* l : held_a) EXPECT_EQ(kdn_lease_release(a.c, l), KDN_OK);
  EXPECT_EQ(hold_doc(b, 2, 300, &held_b), KDN_OK) << "the uid's pins freed by the other session";
  for (kdn_lease* l : held_b) EXPECT_EQ(kdn_lease_release(b.c, l), KDN_OK);
}

TEST(LeaseMemory, AllSessionsTogetherHoldAtMostMaxLeasesTotal) {
  // Three uids, each well under its own cap of 1000 pins; 1000 pins in all.
  if (::getuid() != 0) KDN_SKIP_OR_FAIL("ROOT", "acting as other uids needs root");
  KdndProcess d({"--set", "max_leases_per_uid=1000", "--set", "max_leases_total=1000", "--set",
                 "namespace.default.allow_uids=4101,4102"});
  ::chmod(d.dir().c_str(), 0755);
  ::chmod(d.socket().c_str(), 0777);
  {
    Conn writer(d, tiny_model());
    ASSERT_TRUE(writer.ok());
    for (uint32_t doc = 0; doc < 4; ++doc) ASSERT_EQ(store_doc(writer, doc, 300), 300);
  }
  Conn root(d, tiny_model());
  ASSERT_TRUE(root.ok());
  std::vector<kdn_lease*> held;
  ASSERT_EQ(hold_doc(root, 0, 300, &held), KDN_OK);
  // Each other uid leases 300 chunks and, still holding them, tells the parent; the parent
  // holds their pins in place by keeping them blocked on a pipe.
  int go[2], ready[2];
  ASSERT_EQ(::pipe(go), 0);
  ASSERT_EQ(::pipe(ready), 0);
  std::vector<pid_t> others;
  for (uint32_t uid : {4101u, 4102u}) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(go[1]);  // else the parent's close would not end the read below
      ::close(ready[0]);
      if (::setgid(uid) != 0 || ::setuid(uid) != 0) ::_exit(99);
      Conn k(d, tiny_model());
      std::vector<kdn_lease*> mine;
      const char st = k.ok() && hold_doc(k, uid - 4100, 300, &mine) == KDN_OK ? 'y' : 'n';
      (void)!::write(ready[1], &st, 1);
      char c;
      (void)!::read(go[0], &c, 1);
      ::_exit(0);
    }
    others.push_back(pid);
  }
  for (size_t i = 0; i < others.size(); ++i) {
    char st = 'n';
    ASSERT_EQ(::read(ready[0], &st, 1), 1);
    EXPECT_EQ(st, 'y') << "another uid's 300 pins";
  }
  // 900 pins of three uids: 300 more are refused whole, though root holds only 300 of its 1000.
  EXPECT_EQ(hold_doc(root, 3, 300, &held), KDN_ERR_LIMIT);
  ::close(go[1]);  // the other uids end, and their pins go with their sessions
  for (pid_t pid : others) ::waitpid(pid, nullptr, 0);
  int st = KDN_ERR_LIMIT;
  for (int i = 0; i < 100 && st == KDN_ERR_LIMIT; ++i) {
    st = hold_doc(root, 3, 300, &held);
    if (st == KDN_ERR_LIMIT) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(st, KDN_OK) << "room again once they ended";
  for (kdn_lease* l : held) EXPECT_EQ(kdn_lease_release(root.c, l), KDN_OK);
  ::close(go[0]);
  ::close(ready[0]);
  ::close(ready[1]);
}

TEST(LeaseMemory, DisconnectedSessionsGiveTheirPinsMemoryBack) {
  KdndProcess d({"--set", "tier.host.bytes=128M"});
  const kdn_model_desc desc = tiny_model(1);  // 1 KiB chunks: many pins, little arena
  {
    Conn writer(d, desc);
    ASSERT_TRUE(writer.ok());
    for (uint32_t doc = 0; doc < 8; ++doc) ASSERT_EQ(store_doc(writer, doc, kDocChunks), int(kDocChunks)) << doc;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const long before = rss_anon_kib(d.pid());
  long holding = 0;
  {
    std::vector<std::unique_ptr<Conn>> readers;
    for (int r = 0; r < 4; ++r) {
      readers.push_back(std::make_unique<Conn>(d, desc));
      ASSERT_TRUE(readers.back()->ok());
      std::vector<kdn_lease*> held;  // not released: the session's end releases them
      for (uint32_t doc = 0; doc < 8; ++doc) ASSERT_EQ(hold_doc(*readers.back(), doc, kDocChunks, &held), KDN_OK);
    }
    holding = rss_anon_kib(d.pid());
  }
  // 128,000 pins held, then every reader gone.
  long after = holding;
  for (int i = 0; i < 50 && after > before + 4096; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    after = rss_anon_kib(d.pid());
  }
  std::printf("kdnd RssAnon: %ld KiB before, %ld KiB holding 128000 pins, %ld KiB after\n", before, holding, after);
  EXPECT_GT(holding, before + 8192) << "the pins cost memory (the test measures something)";
  EXPECT_LE(after, before + 4096) << "what the ended sessions held went back to the kernel";
}

}  // namespace
}  // namespace kdn::testing
