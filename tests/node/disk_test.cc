// T2 end to end: a real kdnd with slab files in a temporary directory, real engine processes
// (fork), libkdn. Chunks go down to disk (evicted from the arena, or written through at
// commit), come back by promotion, survive restarts after SIGTERM and SIGKILL, and every fault
// a test can do to the files from outside is a miss, never a wrong byte.
#include "kdnd_process.h"
#include "raw_client.h"

#include <kdn/common/clock.h>
#include <kdn/kernels/codec.h>
#include <kdn/kernels/synthetic.h>

#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <thread>
#include <vector>

namespace kdn::testing {
namespace {

// A disk directory of its own, removed at the end.
struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/kdn-t2-XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

std::vector<std::string> disk_flags(const std::string& dir, const char* policy = "write_back",
                                    const char* bytes = "128M") {
  return {"--set", "tier.disk.dirs=" + dir,    "--set", std::string("tier.disk.bytes=") + bytes,
          "--set", "tier.disk.slab_bytes=16M", "--set", std::string("tier.disk.policy=") + policy};
}

struct Conn {
  kdn_client* c = nullptr;
  kdn_model* m = nullptr;
  Conn(const KdndProcess& d, const kdn_model_desc& desc, const char* ns = nullptr) {
    kdn_connect_opts o = d.opts(ns);
    if (ns) o.flags = 0;  // disk namespaces are declared, not created
    if (kdn_connect(&o, &c) != KDN_OK) return;
    if (kdn_register_model(c, &desc, &m) != KDN_OK) m = nullptr;
  }
  ~Conn() { kdn_disconnect(c); }
  bool ok() const { return c && m; }
  uint64_t chunk() const { return kdn_model_chunk_bytes(m); }
  uint32_t tokens() const { return kdn_model_chunk_tokens(m); }
};

// Stores chunks [0, n) of document `doc`, in commits of at most `batch`; -1 on error.
int store_doc(Conn& k, uint32_t doc, uint32_t n, uint32_t batch = 64) {
  auto tok = doc_tokens(doc, size_t(n) * k.tokens());
  int written = 0;
  for (uint32_t first = 0; first < n; first += batch) {
    const uint32_t m = std::min(batch, n - first);
    kdn_store* s = nullptr;
    if (kdn_store_reserve(k.c, k.m, tok.data(), tok.size(), first, m, &s) != KDN_OK) return -1;
    for (uint32_t i = 0; i < kdn_store_chunks(s); ++i) {
      if (void* p = kdn_store_chunk_data(s, i)) {
        fill_chunk(p, k.chunk(), doc, first + i);
        ++written;
      }
    }
    if (kdn_store_commit(k.c, s) != KDN_OK) return -1;
  }
  return written;
}

// Leases the cached prefix of `doc`; returns the chunks that match, -1 if any byte differs or
// on error.
int verify_doc(Conn& k, uint32_t doc, uint32_t n) {
  auto tok = doc_tokens(doc, size_t(n) * k.tokens());
  kdn_lease* l = nullptr;
  if (kdn_retrieve_lease(k.c, k.m, tok.data(), tok.size(), 0, &l) != KDN_OK) return -1;
  int good = 0;
  for (uint32_t i = 0; i < kdn_lease_chunks(l); ++i)
    good = check_chunk(kdn_lease_chunk_data(l, i), k.chunk(), doc, i) && good >= 0 ? good + 1 : -1000;
  if (kdn_lease_release(k.c, l) != KDN_OK) return -1;
  return good < 0 ? -1 : good;
}

kdn_lookup_result lookup_doc(Conn& k, uint32_t doc, uint32_t n) {
  auto tok = doc_tokens(doc, size_t(n) * k.tokens());
  kdn_lookup_result r{};
  EXPECT_EQ(kdn_lookup(k.c, k.m, tok.data(), tok.size(), &r), KDN_OK);
  return r;
}

kdn_stats stats_of(Conn& k) {
  kdn_stats s{};
  s.struct_size = sizeof s;
  EXPECT_EQ(kdn_get_stats(k.c, &s), KDN_OK);
  return s;
}

// Admin: every unleased chunk leaves the arena for the disk tier (kdnctl evict --all --tier host).
void demote_all(const KdndProcess& d, const char* ns = "default") {
  RawClientOptions o;
  o.flags = ipc::kHelloFlagAdmin;
  o.name_space = ns;
  RawClient admin(d, o);
  ASSERT_TRUE(admin.ok);
  ipc::Sqe q{};
  q.opcode = uint8_t(ipc::Opcode::kEvict);
  ipc::EvictOp::put({ipc::EvictMode::kHost}, q);
  ASSERT_EQ(admin.call(q), KDN_OK);
}

constexpr uint32_t kDisk = 2, kHost = 1;

TEST(Disk, ChunksGoDownAndComeBackByteForByte) {
  TempDir dir;
  auto flags = disk_flags(dir.path);
  flags.insert(flags.end(), {"--host-arena-bytes", "32M", "--slab-bytes", "1M"});
  KdndProcess d(flags);
  const auto desc = tiny_model(64);  // 64 KiB chunks; the arena holds about 500
  Conn k(d, desc);
  ASSERT_TRUE(k.ok());
  // 12 documents of 100 chunks: 75 MiB through a 32 MiB arena, demoted as it fills.
  for (uint32_t doc = 0; doc < 12; ++doc) ASSERT_EQ(store_doc(k, doc, 100), 100) << doc;
  kdn_stats s = stats_of(k);
  EXPECT_GT(s.demoted_chunks, 500u);
  EXPECT_GT(s.tier_resident_chunks[kDisk], 500u);
  EXPECT_EQ(s.dropped_chunks, 0u) << "nothing left the node: the disk holds what the arena evicted";
  // The oldest documents sit on disk only: lookup says so, a lease promotes them.
  kdn_lookup_result r = lookup_doc(k, 0, 100);
  EXPECT_EQ(r.hit_chunks, 100u);
  EXPECT_GT(r.tier_chunks[kDisk], 0u);
  for (uint32_t doc = 0; doc < 12; ++doc) EXPECT_EQ(verify_doc(k, doc, 100), 100) << doc;
  s = stats_of(k);
  EXPECT_GT(s.promoted_chunks, 0u);
  EXPECT_EQ(s.corrupt_chunks, 0u);
}

TEST(Disk, EveryCodecRoundTrips) {
  TempDir dir;
  auto flags = disk_flags(dir.path, "write_back", "32M");
  for (const char* ns : {"none", "lossless", "int8", "kivi4"}) {
    flags.push_back("--set");
    flags.push_back(std::string("namespace.") + ns + ".disk_codec=" + ns);
  }
  KdndProcess d(flags);
  const auto desc = tiny_model(256);  // 256 KiB chunks of synthetic KV (the codec needs finite numbers)
  const auto g = kernels::ChunkGeometry{2, 2, 64, 256, kernels::DType::kF16};
  for (const char* ns : {"none", "lossless", "int8", "kivi4"}) {
    SCOPED_TRACE(ns);
    Conn k(d, desc, ns);
    ASSERT_TRUE(k.ok());
    auto tok = doc_tokens(1, 8 * 256);
    std::vector<std::vector<uint8_t>> orig(8, std::vector<uint8_t>(k.chunk()));
    kdn_store* s = nullptr;
    ASSERT_EQ(kdn_store_reserve(k.c, k.m, tok.data(), tok.size(), 0, 8, &s), KDN_OK);
    for (uint32_t i = 0; i < 8; ++i) {
      kernels::SyntheticKvParams p;
      p.seed = 100 + i;
      ASSERT_TRUE(kernels::fill_synthetic_kv(orig[i].data(), g, p).ok());
      std::memcpy(kdn_store_chunk_data(s, i), orig[i].data(), k.chunk());
    }
    ASSERT_EQ(kdn_store_commit(k.c, s), KDN_OK);
    demote_all(d, ns);
    EXPECT_EQ(lookup_doc(k, 1, 8).tier_chunks[kDisk], 8u);
    kdn_lease* l = nullptr;
    ASSERT_EQ(kdn_retrieve_lease(k.c, k.m, tok.data(), tok.size(), 0, &l), KDN_OK);
    ASSERT_EQ(kdn_lease_chunks(l), 8u);
    const bool exact = std::string(ns) == "none" || std::string(ns) == "lossless";
    for (uint32_t i = 0; i < 8; ++i) {
      const void* got = kdn_lease_chunk_data(l, i);
      if (exact) {
        EXPECT_EQ(std::memcmp(got, orig[i].data(), k.chunk()), 0) << i;
      } else {
        const auto q = kernels::kvc1_quality(g, orig[i].data(), got, 1);
        EXPECT_LT(q.rel_frobenius_error, 0.15) << i;
      }
    }
    ASSERT_EQ(kdn_lease_release(k.c, l), KDN_OK);
  }
}

// Restart with 10,000 chunks of 64 KiB: after SIGTERM (write_back: kdnd writes the arena down
// before it exits) and after SIGKILL (write_through: every COMMIT that completed is on disk).
void restart_keeps_every_chunk(const char* policy, bool kill9) {
  TempDir dir;
  auto flags = disk_flags(dir.path, policy, "1G");
  flags.insert(flags.end(), {"--log-level", "info"});
  KdndProcess d(flags);
  const auto desc = tiny_model(64);
  constexpr uint32_t kDocs = 100, kChunks = 100;
  {
    Conn k(d, desc);
    ASSERT_TRUE(k.ok());
    for (uint32_t doc = 0; doc < kDocs; ++doc) ASSERT_EQ(store_doc(k, doc, kChunks), int(kChunks)) << doc;
  }
  if (kill9)
    d.kill9();
  else
    ASSERT_EQ(d.stop(), 0);
  ASSERT_TRUE(d.restart()) << d.log();
  // kdnd says how long recovery took (the benchmark reports it; here it is only shown).
  const std::string log = d.log();
  const std::regex ready(R"(disk tier ready: (\d+) chunks .* in ([0-9.]+) s)");
  std::smatch last;  // of the second start
  for (auto it = std::sregex_iterator(log.begin(), log.end(), ready); it != std::sregex_iterator(); ++it) last = *it;
  ASSERT_FALSE(last.empty()) << log;
  std::printf("recovered %s chunks in %s s\n", last[1].str().c_str(), last[2].str().c_str());
  EXPECT_EQ(std::stoul(last[1].str()), kDocs * kChunks);
  Conn k(d, desc);
  ASSERT_TRUE(k.ok());
  kdn_lookup_result r = lookup_doc(k, 0, kChunks);
  EXPECT_EQ(r.tier_chunks[kDisk], kChunks) << "after a restart everything comes from disk";
  for (uint32_t doc = 0; doc < kDocs; ++doc) ASSERT_EQ(verify_doc(k, doc, kChunks), int(kChunks)) << doc;
  EXPECT_EQ(stats_of(k).corrupt_chunks, 0u);
}

TEST(Disk, RestartAfterSigtermServesEvery10kChunk) { restart_keeps_every_chunk("write_back", false); }
TEST(Disk, RestartAfterSigkillServesEveryWrittenThroughChunk) { restart_keeps_every_chunk("write_through", true); }

// write_back and SIGKILL: what the arena had demoted (its disk write landed) survives the crash;
// what was only in the arena is gone, a miss, never a wrong byte.
TEST(Disk, RestartAfterSigkillServesEveryDemotedChunk) {
  TempDir dir;
  // No read-ahead: the lookups below count what sits on disk, and must not bring it back.
  auto flags = disk_flags(dir.path, "write_back");
  flags.insert(flags.end(), {"--set", "tier.disk.read_ahead=0"});
  KdndProcess d(flags);
  const auto desc = tiny_model(64);
  constexpr uint32_t kChunks = 50;
  {
    Conn k(d, desc);
    ASSERT_TRUE(k.ok());
    for (uint32_t doc = 0; doc < 4; ++doc) ASSERT_EQ(store_doc(k, doc, kChunks), int(kChunks)) << doc;
    demote_all(d);
    // A chunk's fastest copy is on disk once its write landed and the arena let it go; the
    // writes land in any order.
    auto on_disk = [&] {
      uint32_t n = 0;
      for (uint32_t doc = 0; doc < 4; ++doc) n += lookup_doc(k, doc, kChunks).tier_chunks[kDisk];
      return n;
    };
    for (int i = 0; i < 1000 && on_disk() < 4 * kChunks; ++i) usleep(10000);
    for (uint32_t doc = 0; doc < 4; ++doc) ASSERT_EQ(lookup_doc(k, doc, kChunks).tier_chunks[kDisk], kChunks) << doc;
    // Two more documents only in the arena.
    for (uint32_t doc = 4; doc < 6; ++doc) ASSERT_EQ(store_doc(k, doc, kChunks), int(kChunks)) << doc;
  }
  d.kill9();
  ASSERT_TRUE(d.restart()) << d.log();
  Conn k(d, desc);
  ASSERT_TRUE(k.ok());
  for (uint32_t doc = 0; doc < 4; ++doc) EXPECT_EQ(verify_doc(k, doc, kChunks), int(kChunks)) << doc;
  for (uint32_t doc = 4; doc < 6; ++doc) {
    EXPECT_EQ(lookup_doc(k, doc, kChunks).hit_chunks, 0u) << "never written down: lost with the arena";
    EXPECT_EQ(verify_doc(k, doc, kChunks), 0) << doc;
  }
  EXPECT_EQ(stats_of(k).corrupt_chunks, 0u);
}

// The file offset of the slot header holding `key` (docs/disk-format.md: headers start with
// "KDNSLOT1" at block boundaries, the key at byte 48), or -1.
off_t find_slot(const std::string& file, const kdn_key& key) {
  std::ifstream in(file, std::ios::binary);
  std::vector<char> block(4096);
  for (off_t off = 0; in.read(block.data(), 4096); off += 4096) {
    kdn_key k;
    std::memcpy(&k, block.data() + 48, sizeof k);
    if (std::memcmp(block.data(), "KDNSLOT1", 8) == 0 && k == key) return off;
  }
  return -1;
}

TEST(Disk, FlippedBytesAreAMissAndNeverServed) {
  TempDir dir;
  KdndProcess d(disk_flags(dir.path, "write_through"));
  const auto desc = tiny_model(64);
  {
    Conn k(d, desc);
    ASSERT_TRUE(k.ok());
    ASSERT_EQ(store_doc(k, 5, 10), 10);
  }
  ASSERT_EQ(d.stop(), 0);
  // Damage chunk 4's payload on disk.
  auto m = ModelInfo::from_desc(desc);
  ASSERT_TRUE(m.ok());
  auto tok = doc_tokens(5, 10 * 64);
  std::vector<kdn_key> keys(10);
  ASSERT_EQ(prefix_keys(*m, tok, keys), 10u);
  const std::string file = dir.path + "/default/slabs.kdn";
  const off_t at = find_slot(file, keys[4]);
  ASSERT_GE(at, 0);
  {
    const int fd = ::open(file.c_str(), O_RDWR);
    char c = 0;
    ASSERT_EQ(::pread(fd, &c, 1, at + 4096 + 777), 1);
    c ^= 1;
    ASSERT_EQ(::pwrite(fd, &c, 1, at + 4096 + 777), 1);
    ::close(fd);
  }
  ASSERT_TRUE(d.restart());
  Conn k(d, desc);
  ASSERT_TRUE(k.ok());
  EXPECT_EQ(lookup_doc(k, 5, 10).hit_chunks, 10u) << "the header is intact: found at recovery";
  EXPECT_EQ(verify_doc(k, 5, 10), 4) << "the lease stops at the damaged chunk, the others match";
  EXPECT_EQ(stats_of(k).corrupt_chunks, 1u);
  EXPECT_EQ(lookup_doc(k, 5, 10).hit_chunks, 4u) << "the damaged copy was dropped";
  // Erased from disk too: another restart does not bring it back.
  ASSERT_TRUE(d.restart());
  Conn k2(d, desc);
  EXPECT_EQ(lookup_doc(k2, 5, 10).hit_chunks, 4u);
}

TEST(Disk, AFileTruncatedUnderTheDaemonIsAMiss) {
  TempDir dir;
  KdndProcess d(disk_flags(dir.path, "write_through"));
  const auto desc = tiny_model(64);
  Conn k(d, desc);
  ASSERT_TRUE(k.ok());
  ASSERT_EQ(store_doc(k, 7, 20), 20);
  demote_all(d);
  const std::string file = dir.path + "/default/slabs.kdn";
  ASSERT_EQ(::truncate(file.c_str(), 4096 * 8), 0);  // superblock and table stay, every slab goes
  EXPECT_EQ(verify_doc(k, 7, 20), 0) << "no byte of a truncated file is served";
  EXPECT_TRUE(d.alive());
  EXPECT_GE(stats_of(k).corrupt_chunks, 1u);
  ASSERT_EQ(store_doc(k, 8, 4), 4) << "and kdnd goes on storing";
  EXPECT_EQ(verify_doc(k, 8, 4), 4);
}

TEST(Disk, ADirectoryThatCannotServeStopsKdndWithItsName) {
  const std::string missing = "/tmp/kdn-no-such-dir-for-t2";
  char tmpl[] = "/tmp/kdn-t2-sock-XXXXXX";
  const std::string sock_dir = mkdtemp(tmpl);
  const std::string log = sock_dir + "/log";
  const pid_t pid = fork();
  if (pid == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT, 0600);
    ::dup2(fd, 2);
    ::dup2(fd, 1);
    execl(kdn::testing::kdnd_binary(), kdn::testing::kdnd_binary(), "--socket", (sock_dir + "/s").c_str(),
          "--no-populate", "--host-arena-bytes", "64M", "--set", ("tier.disk.dirs=" + missing).c_str(), nullptr);
    _exit(127);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) != 0);
  std::ifstream in(log);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find(missing), std::string::npos) << text;
  std::filesystem::remove_all(sock_dir);
}

TEST(Disk, ConcurrentEnginesOnChunksBeingPromoted) {
  TempDir dir;
  KdndProcess d(disk_flags(dir.path, "write_through"));
  const auto desc = tiny_model(64);
  {
    Conn k(d, desc);
    ASSERT_TRUE(k.ok());
    ASSERT_EQ(store_doc(k, 3, 200), 200);
  }
  for (int round = 0; round < 3; ++round) {
    demote_all(d);
    std::vector<pid_t> kids;
    for (int e = 0; e < 4; ++e) {
      const pid_t p = fork();
      if (p == 0) {
        Conn k(d, desc);
        _exit(k.ok() && verify_doc(k, 3, 200) == 200 ? 0 : 1);
      }
      kids.push_back(p);
    }
    for (pid_t p : kids) {
      int st = 0;
      waitpid(p, &st, 0);
      EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "round " << round;
    }
  }
}

TEST(Disk, AClientKilledWhileItsLeaseWaitsOnAPromotion) {
  TempDir dir;
  KdndProcess d(disk_flags(dir.path, "write_through"));
  const auto desc = tiny_model(64);
  {
    Conn k(d, desc);
    ASSERT_TRUE(k.ok());
    ASSERT_EQ(store_doc(k, 9, 300), 300);
  }
  demote_all(d);
  auto m = ModelInfo::from_desc(desc);
  auto tok = doc_tokens(9, 300 * 64);
  std::vector<kdn_key> keys(300);
  ASSERT_EQ(prefix_keys(*m, tok, keys), 300u);
  // The child posts a LEASE of 300 disk-only chunks and dies before it completes.
  const int code = in_child([&] {
    RawClient c(d, 1 << 20);
    if (!c.ok) return 1;
    const uint32_t id = c.register_model(desc);
    std::memcpy(c.s.payload(), keys.data(), keys.size() * sizeof(kdn_key));
    ipc::Sqe q{};
    q.opcode = uint8_t(ipc::Opcode::kLease);
    ipc::LeaseOp::put({id, 300}, q);
    q.in_off = 0;
    q.in_len = uint32_t(keys.size() * sizeof(kdn_key));
    q.out_off = 512 << 10;
    q.out_len = uint32_t(300 * sizeof(ipc::LeaseRecord));
    q.user_data = 1;
    (void)c.s.submit(std::span<const ipc::Sqe>(&q, 1));
    raise(SIGKILL);
    return 2;
  });
  EXPECT_EQ(code, 128 + SIGKILL);
  Conn k(d, desc);
  ASSERT_TRUE(k.ok());
  EXPECT_EQ(verify_doc(k, 9, 300), 300) << "the promotions it started land, nothing is lost or torn";
  const kdn_stats s = stats_of(k);
  EXPECT_EQ(s.active_leases, 0u) << "its leases died with it";
}

TEST(Disk, PrefetchBringsTheCachedPrefixIntoTheArena) {
  TempDir dir;
  KdndProcess d(disk_flags(dir.path, "write_through"));
  const auto desc = tiny_model(64);
  Conn k(d, desc);
  ASSERT_TRUE(k.ok());
  ASSERT_EQ(store_doc(k, 4, 40), 40);
  demote_all(d);
  EXPECT_EQ(lookup_doc(k, 4, 40).tier_chunks[kDisk], 40u);
  auto tok = doc_tokens(4, 40 * 64 + 10);
  ASSERT_EQ(kdn_prefetch(k.c, k.m, tok.data(), tok.size()), KDN_OK);
  kdn_lookup_result r{};
  const uint64_t deadline = now_ns() + 5'000'000'000;
  do {
    r = lookup_doc(k, 4, 40);
  } while (r.tier_chunks[kHost] < 40 && now_ns() < deadline);
  EXPECT_EQ(r.tier_chunks[kHost], 40u) << "prefetched without a lease";
  EXPECT_EQ(verify_doc(k, 4, 40), 40);
}

TEST(Disk, AnEngineKeepsWorkingAcrossARestart) {
  TempDir dir;
  KdndProcess d(disk_flags(dir.path, "write_through"));
  const auto desc = tiny_model(64);
  Conn k(d, desc);
  ASSERT_TRUE(k.ok());
  ASSERT_EQ(store_doc(k, 1, 30), 30);
  auto tok = doc_tokens(1, 30 * 64);
  kdn_lease* held = nullptr;
  ASSERT_EQ(kdn_retrieve_lease(k.c, k.m, tok.data(), tok.size(), 0, &held), KDN_OK);
  d.kill9();
  // kdnd is gone: calls fail at once, and keep failing while it is down.
  const uint64_t t0 = now_ns();
  kdn_lookup_result r{};
  EXPECT_EQ(kdn_lookup(k.c, k.m, tok.data(), tok.size(), &r), KDN_ERR_UNAVAILABLE);
  EXPECT_LT(now_ns() - t0, 1'000'000'000ull);
  std::this_thread::sleep_for(std::chrono::milliseconds(250));
  EXPECT_EQ(kdn_lookup(k.c, k.m, tok.data(), tok.size(), &r), KDN_ERR_UNAVAILABLE);
  EXPECT_TRUE(check_chunk(kdn_lease_chunk_data(held, 0), k.chunk(), 1, 0)) << "a lease's bytes stay readable";
  ASSERT_TRUE(d.restart());
  std::this_thread::sleep_for(std::chrono::milliseconds(250));  // past the reconnection rate limit
  ASSERT_EQ(kdn_lookup(k.c, k.m, tok.data(), tok.size(), &r), KDN_OK) << "reconnected by itself";
  EXPECT_EQ(r.hit_chunks, 30u);
  EXPECT_EQ(r.tier_chunks[kDisk], 30u) << "served by the disk tier after the restart";
  EXPECT_EQ(kdn_lease_release(k.c, held), KDN_OK) << "a lease of the lost connection is let go";
  EXPECT_EQ(verify_doc(k, 1, 30), 30);
  ASSERT_EQ(store_doc(k, 2, 5), 5) << "the model was registered again";
  EXPECT_EQ(verify_doc(k, 2, 5), 5);
}

}  // namespace
}  // namespace kdn::testing
