// Two nodes on one machine: two real kdnd processes (separate sockets, arenas and
// directories; nothing shared but the store) on one real Redis Cluster of 3 masters with a
// replica each. An engine on node A prefills a document; an engine on node B gets it from T3
// without prefilling, byte for byte. Faults (a master SIGKILLed mid-run, damaged values, a
// full store) are misses on B, never errors or wrong bytes; bad configuration stops kdnd at
// start with a message naming what is wrong.
#include "cluster_suite.h"
#include "kdnd_process.h"
#include "raw_client.h"
#include "redis_servers.h"
#include "remote_format.h"

#include <kdn/kernels/codec.h>
#include <kdn/kernels/synthetic.h>

#include <gtest/gtest.h>
#include <kdn/common/testing/require.h>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace kdn::testing {
namespace {

using namespace std::chrono_literals;
constexpr uint32_t kRemote = 3, kHost = 1;

std::vector<std::string> remote_flags(int port, const char* policy = "write_through", const char* mode = "cluster") {
  return {"--set",       "tier.remote.seeds=127.0.0.1:" + std::to_string(port),
          "--set",       std::string("tier.remote.mode=") + mode,
          "--set",       std::string("tier.remote.policy=") + policy,
          "--set",       "tier.remote.timeout_ms=500",
          "--log-level", "info"};
}

kdn_stats stats(const KdndProcess& d, const char* ns = nullptr) { return stats_of(d, ns); }

// Waits until node `d` counts `n` chunks uploaded (write_through uploads run after COMMIT).
bool wait_uploaded(const KdndProcess& d, uint64_t n, const char* ns = nullptr) {
  for (int i = 0; i < 500; ++i) {
    if (stats(d, ns).tier_resident_chunks[kRemote] >= n) return true;
    std::this_thread::sleep_for(10ms);
  }
  return false;
}

kdn_lookup_result lookup_doc(Conn& k, uint32_t doc, uint32_t n) {
  auto tok = doc_tokens(doc, size_t(n) * kdn_model_chunk_tokens(k.m));
  kdn_lookup_result r{};
  EXPECT_EQ(kdn_lookup(k.c, k.m, tok.data(), tok.size(), &r), KDN_OK);
  return r;
}

// Admin: the node forgets every chunk (its T3 copies stay in the store for every node).
void forget_all(const KdndProcess& d) {
  RawClientOptions o;
  o.flags = ipc::kHelloFlagAdmin;
  o.name_space = "default";
  RawClient admin(d, o);
  ASSERT_TRUE(admin.ok);
  ipc::Sqe q{};
  q.opcode = uint8_t(ipc::Opcode::kEvict);
  ipc::EvictOp::put({ipc::EvictMode::kAll}, q);
  ASSERT_EQ(admin.call(q), KDN_OK);
}

// The Redis key of chunk `i` of document `doc` (namespace `ns`).
std::string value_key(const kdn_model_desc& desc, uint32_t doc, uint32_t i, const char* ns = "default") {
  kdn_key fp{};
  EXPECT_EQ(kdn_model_fingerprint(&desc, &fp), KDN_OK);
  auto tok = doc_tokens(doc, size_t(i + 1) * desc.chunk_tokens);
  std::vector<kdn_key> keys(i + 1);
  size_t n = 0;
  EXPECT_EQ(kdn_prefix_keys(&desc, tok.data(), tok.size(), keys.data(), keys.size(), &n), KDN_OK);
  return sidecar::remote::value_key(ns, fp, keys[i]);
}

// Runs kdnd with `args` to its exit; its exit status and what it logged.
std::pair<int, std::string> run_kdnd(std::vector<std::string> args) {
  char tmpl[] = "/tmp/kdn-t3-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  const std::string log = dir + "/log";
  args.insert(args.begin(),
              {kdn::testing::kdnd_binary(), "--socket", dir + "/s", "--no-populate", "--host-arena-bytes", "64M"});
  const pid_t pid = fork();
  if (pid == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT, 0600);
    ::dup2(fd, 2);
    ::dup2(fd, 1);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(kdn::testing::kdnd_binary(), argv.data());
    _exit(127);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  std::ifstream in(log);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::filesystem::remove_all(dir);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st), text};
}

class TwoNodes : public ClusterSuite<TwoNodes> {
 protected:
  void SetUp() override {
    if (!redis_missing().empty()) KDN_SKIP_OR_FAIL("REDIS", redis_missing());
    ASSERT_NE(servers_, nullptr) << why_;
    ASSERT_TRUE(servers_->wait_cluster_ok(20));
    for (auto& s : servers_->servers())
      if (s.running()) servers_->cli(s.port, "FLUSHALL");
  }
  int seed() const { return servers_->servers()[0].port; }
};

TEST_F(TwoNodes, NodeBLeasesWhatNodeAPrefilledByteForByte) {
  char tmpl[] = "/tmp/kdn-t3-metrics-XXXXXX";
  const std::string metrics_dir = mkdtemp(tmpl);
  auto fb = remote_flags(seed());
  fb.insert(fb.end(), {"--metrics-file", metrics_dir + "/kdn.prom"});
  KdndProcess a(remote_flags(seed()), "a"), b(fb, "b");
  const auto desc = tiny_model(64);  // 64 KiB chunks
  Conn ka(a, desc), kb(b, desc);
  ASSERT_TRUE(ka.ok() && kb.ok());
  for (uint32_t doc = 0; doc < 4; ++doc) ASSERT_EQ(store_doc(ka, doc, 16), 16);
  ASSERT_TRUE(wait_uploaded(a, 64)) << stats(a).tier_resident_chunks[kRemote];
  // B has never seen them: its lookup finds them in T3, its lease brings them into its arena.
  for (uint32_t doc = 0; doc < 4; ++doc) {
    const kdn_lookup_result r = lookup_doc(kb, doc, 16);
    EXPECT_EQ(r.hit_chunks, 16u) << doc;
    EXPECT_EQ(r.tier_chunks[kRemote], 16u) << doc;
    EXPECT_EQ(verify_doc(kb, doc, 16), 16) << doc;
  }
  // Then they are B's own: a second lookup finds them in its host tier.
  EXPECT_EQ(lookup_doc(kb, 0, 16).tier_chunks[kHost], 16u);
  // A lease with no lookup before it asks T3 itself.
  ASSERT_EQ(store_doc(ka, 9, 16), 16);
  ASSERT_TRUE(wait_uploaded(a, 80));
  EXPECT_EQ(verify_doc(kb, 9, 16), 16);
  // A chunk nobody stored is a miss on both, after one round trip.
  EXPECT_EQ(lookup_doc(kb, 77, 16).hit_chunks, 0u);
  const kdn_stats sb = stats(b);
  EXPECT_EQ(sb.promoted_chunks, 80u);
  EXPECT_EQ(sb.corrupt_chunks, 0u);
  EXPECT_EQ(sb.stored_chunks, 0u) << "B prefilled nothing";
  // The metrics file (rewritten every second) says where B's chunks came from.
  const std::string found = "kdn_remote_found_chunks_total{namespace=\"default\"} 80\n";
  const std::string reads = "kdn_remote_reads_total{namespace=\"default\"} 80\n";
  // (Leases count where the chunk was when they reached it: most were promoted by then, by
  // the read-ahead of the lookup before them.)
  const std::string hits = "kdn_hit_chunks_total{namespace=\"default\",op=\"lookup\",tier=\"remote\"} 64\n";
  std::string page;
  for (int i = 0; i < 300; ++i) {
    std::ifstream in(metrics_dir + "/kdn.prom");
    page.assign((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (page.find(found) != std::string::npos && page.find(hits) != std::string::npos) break;
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_NE(page.find(found), std::string::npos) << page;
  EXPECT_NE(page.find(reads), std::string::npos) << page;
  EXPECT_NE(page.find(hits), std::string::npos) << page;
  std::filesystem::remove_all(metrics_dir);
}

TEST_F(TwoNodes, NamespacesNeverSeeEachOthersChunks) {
  auto flags = remote_flags(seed());
  for (const char* ns : {"team-a", "team-b"})
    flags.insert(flags.end(), {"--set", std::string("namespace.") + ns + ".max_bytes=64M"});
  KdndProcess a(flags, "a"), b(flags, "b");
  const auto desc = tiny_model(64);
  Conn ka(a, desc, "team-a"), kb_other(b, desc, "team-b"), kb_same(b, desc, "team-a");
  ASSERT_TRUE(ka.ok() && kb_other.ok() && kb_same.ok());
  ASSERT_EQ(store_doc(ka, 1, 8), 8);
  ASSERT_TRUE(wait_uploaded(a, 8, "team-a"));
  EXPECT_EQ(lookup_doc(kb_other, 1, 8).hit_chunks, 0u);
  EXPECT_EQ(verify_doc(kb_other, 1, 8), 0);
  EXPECT_EQ(verify_doc(kb_same, 1, 8), 8);
}

TEST_F(TwoNodes, DamagedAndMissingValuesAreMissesNeverWrongBytes) {
  KdndProcess a(remote_flags(seed()), "a"), b(remote_flags(seed()), "b");
  const auto desc = tiny_model(64);
  Conn ka(a, desc), kb(b, desc);
  ASSERT_TRUE(ka.ok() && kb.ok());
  for (uint32_t doc = 0; doc < 3; ++doc) ASSERT_EQ(store_doc(ka, doc, 8), 8);
  ASSERT_TRUE(wait_uploaded(a, 24));
  const int port = seed();
  // doc 0: one payload byte of chunk 5 flipped (its CRC fails); doc 1: chunk 3 deleted;
  // doc 2: chunk 2 truncated.
  EXPECT_NE(servers_->cli(port, "-c SETRANGE " + value_key(desc, 0, 5) + " 1000 Z"), "");
  EXPECT_NE(servers_->cli(port, "-c DEL " + value_key(desc, 1, 3)), "");
  EXPECT_NE(servers_->cli(port, "-c SET " + value_key(desc, 2, 2) + " short"), "");
  // B's lookup sees what EXISTS says (doc 0 and doc 2 look whole); the leases stop where the
  // damage is, every byte served checked.
  EXPECT_EQ(lookup_doc(kb, 1, 8).hit_chunks, 3u);
  EXPECT_EQ(verify_doc(kb, 0, 8), 5);
  EXPECT_EQ(verify_doc(kb, 1, 8), 3);
  EXPECT_EQ(verify_doc(kb, 2, 8), 2);
  const kdn_stats sb = stats(b);
  EXPECT_EQ(sb.corrupt_chunks, 2u) << "the flipped and the truncated value";
  // The damaged chunks are forgotten, not served: asking again is a miss again, not an error.
  EXPECT_EQ(verify_doc(kb, 0, 8), 5);
  // A prefills doc 0 again (its next upload overwrites the damaged value): B finds all of it.
  forget_all(a);
  ASSERT_EQ(store_doc(ka, 0, 8), 8);
  ASSERT_TRUE(wait_uploaded(a, 8));
  forget_all(b);
  EXPECT_EQ(verify_doc(kb, 0, 8), 8);
}

TEST_F(TwoNodes, EveryCodecCrossesNodes) {
  // A uploads each namespace in its codec; B reads with codec none everywhere: a reader decodes
  // what the value says.
  std::vector<std::string> fa = remote_flags(seed()), fb = remote_flags(seed());
  const char* codecs[] = {"none", "lossless", "int8", "kivi4"};
  for (const char* c : codecs) {
    fa.insert(fa.end(), {"--set", std::string("namespace.") + c + ".remote_codec=" + c, "--set",
                         std::string("namespace.") + c + ".max_bytes=32M"});
    fb.insert(fb.end(), {"--set", std::string("namespace.") + c + ".max_bytes=32M"});
  }
  KdndProcess a(fa, "a"), b(fb, "b");
  const auto desc = tiny_model(256);  // 256 KiB chunks of synthetic KV (the codec needs finite numbers)
  const auto g = kernels::ChunkGeometry{2, 2, 64, 256, kernels::DType::kF16};
  for (const char* c : codecs) {
    SCOPED_TRACE(c);
    Conn ka(a, desc, c), kb(b, desc, c);
    ASSERT_TRUE(ka.ok() && kb.ok());
    auto tok = doc_tokens(1, 8 * 256);
    std::vector<std::vector<uint8_t>> orig(8, std::vector<uint8_t>(kdn_model_chunk_bytes(ka.m)));
    kdn_store* s = nullptr;
    ASSERT_EQ(kdn_store_reserve(ka.c, ka.m, tok.data(), tok.size(), 0, 8, &s), KDN_OK);
    for (uint32_t i = 0; i < 8; ++i) {
      kernels::SyntheticKvParams p;
      p.seed = 100 + i;
      ASSERT_TRUE(kernels::fill_synthetic_kv(orig[i].data(), g, p).ok());
      std::memcpy(kdn_store_chunk_data(s, i), orig[i].data(), orig[i].size());
    }
    ASSERT_EQ(kdn_store_commit(ka.c, s), KDN_OK);
    ASSERT_TRUE(wait_uploaded(a, 8, c));
    // The stored value is the encoding: smaller than the chunk for every codec but none.
    const std::string len = servers_->cli(seed(), "-c STRLEN " + value_key(desc, 1, 0, c));
    const uint64_t stored = std::stoull(len.empty() ? "0" : len);
    if (std::string(c) == "none")
      EXPECT_EQ(stored, orig[0].size() + 192);
    else
      EXPECT_LT(stored, orig[0].size()) << len;
    kdn_lease* l = nullptr;
    ASSERT_EQ(kdn_retrieve_lease(kb.c, kb.m, tok.data(), tok.size(), 0, &l), KDN_OK);
    ASSERT_EQ(kdn_lease_chunks(l), 8u);
    const bool exact = std::string(c) == "none" || std::string(c) == "lossless";
    for (uint32_t i = 0; i < 8; ++i) {
      const void* got = kdn_lease_chunk_data(l, i);
      if (exact) {
        EXPECT_EQ(std::memcmp(got, orig[i].data(), orig[i].size()), 0) << i;
      } else {
        const auto q = kernels::kvc1_quality(g, orig[i].data(), got, 1);
        EXPECT_LT(q.rel_frobenius_error, 0.15) << i;
      }
    }
    ASSERT_EQ(kdn_lease_release(kb.c, l), KDN_OK);
  }
}

TEST_F(TwoNodes, AKilledMasterMeansMissesUntilItsReplicaTakesOver) {
  KdndProcess a(remote_flags(seed()), "a"), b(remote_flags(seed()), "b");
  const auto desc = tiny_model(64);
  Conn ka(a, desc), kb(b, desc);
  ASSERT_TRUE(ka.ok() && kb.ok());
  constexpr uint32_t kDocs = 8, kChunks = 12;
  for (uint32_t doc = 0; doc < kDocs; ++doc) ASSERT_EQ(store_doc(ka, doc, kChunks), int(kChunks));
  ASSERT_TRUE(wait_uploaded(a, kDocs * kChunks));
  ASSERT_TRUE(servers_->wait_replicas_synced(10));
  // Kill a master that is not the seed: B keeps reading (forgetting what it read each round,
  // so every round goes to T3). Each lease is a verified prefix or a miss, never an error.
  RedisServerProcess* victim = nullptr;
  for (auto& s : servers_->servers())
    if (s.port != seed() && servers_->cli(s.port, "ROLE").rfind("master", 0) == 0) victim = &s;
  ASSERT_NE(victim, nullptr);
  victim->kill9();
  const auto start = std::chrono::steady_clock::now();
  uint64_t short_rounds = 0, whole_rounds = 0;
  bool recovered = false;
  while (std::chrono::steady_clock::now() - start < 30s) {
    forget_all(b);
    uint32_t whole = 0;
    for (uint32_t doc = 0; doc < kDocs; ++doc) {
      const auto t0 = std::chrono::steady_clock::now();
      const int got = verify_doc(kb, doc, kChunks);
      ASSERT_GE(got, 0) << "an error or a wrong byte";
      // No lease waits on the dead master longer than the deadline (500 ms) and the slot map.
      EXPECT_LT(std::chrono::steady_clock::now() - t0, 1500ms);
      whole += got == int(kChunks);
    }
    (whole == kDocs ? whole_rounds : short_rounds) += 1;
    if (whole == kDocs && short_rounds > 0) {
      recovered = true;
      break;
    }
  }
  EXPECT_GT(short_rounds, 0u) << "the kill never showed";
  EXPECT_TRUE(recovered) << "the replica never took over";
  EXPECT_EQ(stats(b).corrupt_chunks, 0u);
}

TEST(TwoNodesStandalone, AFullStoreLeavesChunksOnTheirNodeAndCommitsSucceed) {
  if (!redis_missing().empty()) KDN_SKIP_OR_FAIL("REDIS", redis_missing());
  std::string why;
  auto redis = RedisServers::standalone({"--maxmemory", "2mb", "--maxmemory-policy", "noeviction"}, &why);
  ASSERT_NE(redis, nullptr) << why;
  const int port = redis->servers()[0].port;
  KdndProcess a(remote_flags(port, "write_through", "standalone"), "a"),
      b(remote_flags(port, "write_through", "standalone"), "b");
  const auto desc = tiny_model(64);
  Conn ka(a, desc), kb(b, desc);
  ASSERT_TRUE(ka.ok() && kb.ok());
  // The first document lands before the rest is sent: a burst of pipelined writes counts in
  // Redis's memory as its query buffer, and a slow store could refuse every write of one burst.
  ASSERT_EQ(store_doc(ka, 0, 8), 8);
  for (int i = 0; i < 300 && stats(a).tier_resident_chunks[kRemote] == 0; ++i) std::this_thread::sleep_for(10ms);
  ASSERT_GT(stats(a).tier_resident_chunks[kRemote], 0u) << a.log();
  for (uint32_t doc = 1; doc < 8; ++doc) ASSERT_EQ(store_doc(ka, doc, 8), 8) << "COMMIT does not fail with the store";
  // Uploads land or fail with OOM, which A logs once (housekeeping, every 50 ms).
  const std::string oom = "the store refused a write with OOM";
  for (int i = 0; i < 300 && a.log().find(oom) == std::string::npos; ++i) std::this_thread::sleep_for(10ms);
  std::this_thread::sleep_for(200ms);
  const std::string log = a.log();
  ASSERT_NE(log.find(oom), std::string::npos) << log;
  EXPECT_EQ(log.find(oom), log.rfind(oom)) << "logged once, not per failure";
  const kdn_stats sa = stats(a);
  EXPECT_LT(sa.tier_resident_chunks[kRemote], 64u) << "2 MB cannot hold 4 MB of chunks";
  for (uint32_t doc = 0; doc < 8; ++doc) EXPECT_EQ(verify_doc(ka, doc, 8), 8) << "A still has all of them";
  uint32_t on_b = 0;
  for (uint32_t doc = 0; doc < 8; ++doc) {
    const int got = verify_doc(kb, doc, 8);
    ASSERT_GE(got, 0);
    on_b += uint32_t(got);
  }
  EXPECT_GT(on_b, 0u);
  EXPECT_LT(on_b, 64u);
}

TEST(TwoNodesWriteBack, ChunksLeavingNodeAsMemoryReachNodeB) {
  if (!redis_missing().empty()) KDN_SKIP_OR_FAIL("REDIS", redis_missing());
  std::string why;
  auto redis = RedisServers::standalone({}, &why);
  ASSERT_NE(redis, nullptr) << why;
  const int port = redis->servers()[0].port;
  auto flags = remote_flags(port, "write_back", "standalone");
  flags.insert(flags.end(), {"--host-arena-bytes", "16M", "--slab-bytes", "1M"});
  KdndProcess a(flags, "a"), b(remote_flags(port, "write_through", "standalone"), "b");
  const auto desc = tiny_model(64);
  Conn ka(a, desc), kb(b, desc);
  ASSERT_TRUE(ka.ok() && kb.ok());
  // 24 documents of 16 chunks (24 MiB) through a 16 MiB arena: the oldest leave A's memory
  // for T3 (write_back uploads nothing at commit).
  ASSERT_EQ(store_doc(ka, 0, 16), 16);
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(stats(a).tier_resident_chunks[kRemote], 0u) << "write_back: nothing uploaded at commit";
  for (uint32_t doc = 1; doc < 24; ++doc) ASSERT_EQ(store_doc(ka, doc, 16), 16) << doc;
  const kdn_stats sa = stats(a);
  EXPECT_GT(sa.tier_resident_chunks[kRemote], 64u);
  EXPECT_EQ(sa.dropped_chunks, 0u) << "every evicted chunk went to T3";
  EXPECT_EQ(verify_doc(kb, 0, 16), 16) << "B gets A's oldest document from T3";
  EXPECT_EQ(verify_doc(ka, 0, 16), 16) << "and so does A";
}

TEST(TwoNodesConfig, UnreachableSeedsAndAServerThatIsNoClusterStopKdndAtStart) {
  if (!redis_missing().empty()) KDN_SKIP_OR_FAIL("REDIS", redis_missing());
  // Nothing listens on port 1.
  auto [rc, log] = run_kdnd({"--set", "tier.remote.seeds=127.0.0.1:1", "--set", "tier.remote.timeout_ms=300"});
  EXPECT_NE(rc, 0);
  EXPECT_NE(log.find("127.0.0.1:1"), std::string::npos) << log;
  EXPECT_NE(log.find("did not answer"), std::string::npos) << log;
  // A standalone server named in cluster mode.
  std::string why;
  auto redis = RedisServers::standalone({}, &why);
  ASSERT_NE(redis, nullptr) << why;
  const std::string seed = "127.0.0.1:" + std::to_string(redis->servers()[0].port);
  std::tie(rc, log) = run_kdnd({"--set", "tier.remote.seeds=" + seed});
  EXPECT_NE(rc, 0);
  EXPECT_NE(log.find("not a cluster"), std::string::npos) << log;
  // A hostname, and a standalone mode with two servers: refused before anything connects.
  std::tie(rc, log) = run_kdnd({"--set", "tier.remote.seeds=redis.example:6379"});
  EXPECT_NE(rc, 0);
  EXPECT_NE(log.find("numeric address"), std::string::npos) << log;
  std::tie(rc, log) =
      run_kdnd({"--set", "tier.remote.seeds=127.0.0.1:7000,127.0.0.1:7001", "--set", "tier.remote.mode=standalone"});
  EXPECT_NE(rc, 0);
  EXPECT_NE(log.find("exactly one server"), std::string::npos) << log;
  // The same standalone server in standalone mode: kdnd starts.
  KdndProcess ok(remote_flags(redis->servers()[0].port, "write_through", "standalone"));
  EXPECT_TRUE(ok.alive());
}

}  // namespace
}  // namespace kdn::testing
