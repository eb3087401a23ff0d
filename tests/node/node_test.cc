// Multi-process tests of kdnd + libkdn: real daemon, real engine processes (fork), real
// shared memory. Each test starts its own kdnd on a private socket.
#include "kdnd_process.h"

#include <kdn/common/clock.h>

#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace kdn::testing {
namespace {

TEST(Node, CrossProcessReuse) {
  KdndProcess d;
  const auto desc = smol_model();
  ASSERT_EQ(in_child([&] {
              Conn k(d, desc);
              return k.ok() && store_doc(k, 7, 4) == 4 ? 0 : 1;
            }),
            0);
  // A second engine process finds all four chunks and reads the first one's bytes.
  ASSERT_EQ(in_child([&] {
              Conn k(d, desc);
              if (!k.ok()) return 1;
              auto tok = doc_tokens(7, 4 * 256 + 100);
              kdn_lookup_result r{};
              if (kdn_lookup(k.c, k.m, tok.data(), tok.size(), &r) != KDN_OK) return 2;
              if (r.hit_chunks != 4 || r.hit_tokens != 1024 || r.tier_chunks[1] != 4) return 3;
              return verify_doc(k, 7, 4) == 4 ? 0 : 4;
            }),
            0);
  // Precomputed keys give the same answer.
  {
    Conn k(d, desc);
    auto tok = doc_tokens(7, 4 * 256);
    kdn_key keys[8];
    size_t nk = 0;
    ASSERT_EQ(kdn_prefix_keys(&desc, tok.data(), tok.size(), keys, 8, &nk), KDN_OK);
    ASSERT_EQ(nk, 4u);
    keys[nk++] = kdn_key{1, 2};
    kdn_lookup_result r{};
    ASSERT_EQ(kdn_lookup_keys(k.c, k.m, keys, nk, &r), KDN_OK);
    EXPECT_EQ(r.hit_chunks, 4u);
  }
  // A different document, and the same tokens under another model, are misses.
  Conn k(d, desc);
  auto other = doc_tokens(8, 1024);
  kdn_lookup_result r{};
  ASSERT_EQ(kdn_lookup(k.c, k.m, other.data(), other.size(), &r), KDN_OK);
  EXPECT_EQ(r.hit_chunks, 0u);
  auto desc2 = desc;
  desc2.engine_salt[0] = 9;
  Conn k2(d, desc2);
  auto tok = doc_tokens(7, 1024);
  ASSERT_EQ(kdn_lookup(k2.c, k2.m, tok.data(), tok.size(), &r), KDN_OK);
  EXPECT_EQ(r.hit_chunks, 0u) << "fingerprint mismatch must be a miss";
  // Namespaces isolate tenants.
  Conn k3(d, desc, "tenant-b");
  ASSERT_TRUE(k3.ok());
  ASSERT_EQ(kdn_lookup(k3.c, k3.m, tok.data(), tok.size(), &r), KDN_OK);
  EXPECT_EQ(r.hit_chunks, 0u);
}

TEST(Node, SameKeyStoredConcurrently) {
  KdndProcess d;
  const auto desc = tiny_model();
  constexpr int kProcs = 4;
  std::vector<pid_t> kids;
  int pipefd[2];
  ASSERT_EQ(pipe(pipefd), 0);
  for (int p = 0; p < kProcs; ++p) {
    pid_t pid = fork();
    if (pid == 0) {
      close(pipefd[1]);
      char go;
      if (read(pipefd[0], &go, 1) != 1) _exit(9);
      Conn k(d, desc);
      int total = 0;
      for (int round = 0; round < 20; ++round) {
        int w = store_doc(k, uint32_t(round), 8);
        if (w < 0) _exit(2);
        total += w;
      }
      _exit(total > 255 ? 255 : total);  // chunks this process wrote
    }
    kids.push_back(pid);
  }
  close(pipefd[0]);
  ASSERT_EQ(write(pipefd[1], "gogo", kProcs), kProcs);  // release them together
  close(pipefd[1]);
  int written = 0;
  for (pid_t k : kids) {
    int st = 0;
    waitpid(k, &st, 0);
    ASSERT_TRUE(WIFEXITED(st));
    ASSERT_NE(WEXITSTATUS(st), 2);
    written += WEXITSTATUS(st);
  }
  // Every chunk was written exactly once across the processes, and reads back intact.
  EXPECT_EQ(written, 20 * 8);
  Conn k(d, desc);
  for (uint32_t doc = 0; doc < 20; ++doc) EXPECT_EQ(verify_doc(k, doc, 8), 8) << doc;
}

TEST(Node, EvictionUnderPressureKeepsLeases) {
  // 256 MiB arena, smol chunks of 5.625 MiB: 2 per 16 MiB slab -> 32 chunks fit.
  KdndProcess d;
  const auto desc = smol_model();
  Conn holder(d, desc);
  ASSERT_TRUE(holder.ok());
  ASSERT_EQ(store_doc(holder, 1, 4), 4);
  auto tok = doc_tokens(1, 4 * 256);
  kdn_lease* pinned = nullptr;
  ASSERT_EQ(kdn_retrieve_lease(holder.c, holder.m, tok.data(), tok.size(), 0, &pinned), KDN_OK);
  ASSERT_EQ(kdn_lease_chunks(pinned), 4u);
  // Another process streams 30 documents of 4 chunks through the arena.
  ASSERT_EQ(in_child([&] {
              Conn k(d, desc);
              for (uint32_t doc = 100; doc < 130; ++doc)
                if (store_doc(k, doc, 4) != 4) return 1;
              return 0;
            }),
            0);
  kdn_stats s{};
  s.struct_size = sizeof s;
  ASSERT_EQ(kdn_get_stats(holder.c, &s), KDN_OK);
  EXPECT_GT(s.evicted_chunks, 50u);
  EXPECT_LE(s.resident_bytes, s.capacity_bytes);
  EXPECT_EQ(s.resident_chunks, s.stored_chunks - s.dropped_chunks) << "the counters add up";
  EXPECT_EQ(s.tier_resident_chunks[1], s.resident_chunks);
  // The leased document survived, byte for byte.
  for (uint32_t i = 0; i < 4; ++i)
    EXPECT_TRUE(check_chunk(kdn_lease_chunk_data(pinned, i), kdn_model_chunk_bytes(holder.m), 1, i));
  ASSERT_EQ(kdn_lease_release(holder.c, pinned), KDN_OK);
  // The newest document is there; the oldest unleased ones are gone.
  Conn k(d, desc);
  EXPECT_EQ(verify_doc(k, 129, 4), 4);
  EXPECT_EQ(verify_doc(k, 100, 4), 0);
}

TEST(Node, EvictionKeepsPrefixesUsable) {
  // 32 slots. Document 1 (4 chunks) first, then 29 chunks of others: one eviction is due.
  for (const char* policy : {"lru", "s3fifo"}) {
    KdndProcess d({"--eviction", policy});
    const auto desc = smol_model();
    Conn k(d, desc);
    ASSERT_EQ(store_doc(k, 1, 4), 4);
    for (uint32_t doc = 10; doc < 39; ++doc) ASSERT_EQ(store_doc(k, doc, 1), 1);
    auto tok = doc_tokens(1, 4 * 256);
    kdn_lookup_result r{};
    ASSERT_EQ(kdn_lookup(k.c, k.m, tok.data(), tok.size(), &r), KDN_OK);
    EXPECT_EQ(r.hit_chunks, 3u) << policy << ": the document's tail goes first, its head stays";
  }
}

TEST(Node, ArenaFullOfLeasesReportsNoSpace) {
  KdndProcess d;
  const auto desc = smol_model();
  Conn a(d, desc);
  std::vector<kdn_lease*> leases;
  for (uint32_t doc = 0; doc < 8; ++doc) {
    ASSERT_EQ(store_doc(a, doc, 4), 4);
    auto tok = doc_tokens(doc, 1024);
    kdn_lease* l = nullptr;
    ASSERT_EQ(kdn_retrieve_lease(a.c, a.m, tok.data(), tok.size(), 0, &l), KDN_OK);
    leases.push_back(l);
  }
  auto tok = doc_tokens(99, 1024);
  kdn_store* s = nullptr;
  EXPECT_EQ(kdn_store_reserve(a.c, a.m, tok.data(), tok.size(), 0, 4, &s), KDN_ERR_NO_SPACE);
  for (auto* l : leases) ASSERT_EQ(kdn_lease_release(a.c, l), KDN_OK);
  EXPECT_EQ(store_doc(a, 99, 4), 4);
}

void exits_holding(const KdndProcess& d, bool sigkill) {
  const auto desc = smol_model();
  {
    Conn a(d, desc);
    ASSERT_EQ(store_doc(a, 5, 4), 4);
  }
  int rc = in_child([&] {
    Conn k(d, desc);
    auto tok = doc_tokens(5, 1024);
    kdn_lease* l = nullptr;
    if (kdn_retrieve_lease(k.c, k.m, tok.data(), tok.size(), 0, &l) != KDN_OK) return 1;
    auto other = doc_tokens(6, 1024);
    kdn_store* s = nullptr;
    if (kdn_store_reserve(k.c, k.m, other.data(), other.size(), 0, 4, &s) != KDN_OK) return 2;
    if (sigkill) raise(SIGKILL);
    _exit(0);  // no release, no commit, no disconnect
  });
  EXPECT_EQ(rc, sigkill ? 128 + SIGKILL : 0);
  // The daemon notices the hang-up and drops the holdings.
  kdn_stats s{};
  s.struct_size = sizeof s;
  for (int i = 0; i < 100; ++i) {
    s = stats_of(d);
    if (s.active_leases == 0 && s.open_reservations == 0) break;
    usleep(10000);
  }
  EXPECT_EQ(s.active_leases, 0u);
  EXPECT_EQ(s.open_reservations, 0u);
  Conn b(d, desc);
  EXPECT_EQ(store_doc(b, 6, 4), 4) << "aborted reservations must be storable again";
  kdn_client* admin_view = b.c;
  (void)admin_view;
}

TEST(Node, ClientExitsWithoutReleasing) {
  KdndProcess d;
  exits_holding(d, false);
}

TEST(Node, ClientKilledWithSigkill) {
  KdndProcess d;
  exits_holding(d, true);
}

TEST(Node, AsyncLookup) {
  KdndProcess d;
  Conn k(d, tiny_model());
  ASSERT_EQ(store_doc(k, 3, 5), 5);
  auto tok = doc_tokens(3, 16 * 5);
  std::vector<kdn_op*> ops(16);
  for (auto& op : ops) ASSERT_EQ(kdn_lookup_post(k.c, k.m, tok.data(), tok.size(), &op), KDN_OK);
  for (auto* op : ops) {
    ASSERT_EQ(kdn_op_wait(k.c, op, 1000), KDN_OK);
    kdn_lookup_result r{};
    ASSERT_EQ(kdn_op_lookup_result(op, &r), KDN_OK);
    EXPECT_EQ(r.hit_chunks, 5u);
    kdn_op_release(k.c, op);
  }
}

TEST(Node, AsyncCommitPublishesWhenItsCopiesLand) {
  KdndProcess d;
  const auto desc = smol_model();  // chunks copied by kdnd's workers
  Conn k(d, desc);
  auto tok = doc_tokens(9, 4 * 256);
  kdn_store* s = nullptr;
  ASSERT_EQ(kdn_store_reserve(k.c, k.m, tok.data(), tok.size(), 0, 4, &s), KDN_OK);
  for (uint32_t i = 0; i < 4; ++i) fill_chunk(kdn_store_chunk_data(s, i), kdn_model_chunk_bytes(k.m), 9, i);
  kdn_op* op = nullptr;
  ASSERT_EQ(kdn_store_commit_post(k.c, s, &op), KDN_OK);
  ASSERT_EQ(kdn_op_wait(k.c, op, 5000), KDN_OK);
  kdn_op_release(k.c, op);
  EXPECT_EQ(verify_doc(k, 9, 4), 4);
  // Nothing to commit (every chunk already cached): an op that is complete at once.
  ASSERT_EQ(kdn_store_reserve(k.c, k.m, tok.data(), tok.size(), 0, 4, &s), KDN_OK);
  ASSERT_EQ(kdn_store_commit_post(k.c, s, &op), KDN_OK);
  EXPECT_EQ(kdn_op_poll(k.c, op), KDN_OK);
  kdn_op_release(k.c, op);
}

TEST(Node, CopyVariantsWithPagedLayout) {
  KdndProcess d;
  const auto desc = tiny_model(16);  // 2 layers, 2 heads, 64 dims, 16 tokens per chunk
  Conn a(d, desc);
  ASSERT_TRUE(a.ok());
  // A vLLM flash-attn NHD cache per layer: (2, blocks, block_size, heads, dim), block size 8.
  constexpr int kBlocks = 16, kBS = 8, kH = 2, kD = 64, kTokens = 48;
  const size_t layer_elems = size_t(2) * kBlocks * kBS * kH * kD;
  std::vector<std::vector<uint16_t>> src(2, std::vector<uint16_t>(layer_elems)), dst = src;
  for (auto& l : src)
    for (size_t i = 0; i < l.size(); ++i) l[i] = uint16_t(0x3c00 + (i * 7919) % 1000);
  std::vector<int64_t> slots_a(kTokens), slots_b(kTokens);
  for (int t = 0; t < kTokens; ++t) {
    slots_a[t] = int64_t((t / kBS) * 2 + 1) * kBS + t % kBS;  // odd blocks
    slots_b[t] = int64_t((t / kBS) * 2) * kBS + t % kBS;      // even blocks
  }
  auto layout = [&](std::vector<std::vector<uint16_t>>& buf, std::vector<int64_t>& slots, void** bases) {
    kdn_engine_layout l{};
    l.struct_size = sizeof l;
    l.engine_dtype = KDN_DTYPE_F16;
    bases[0] = buf[0].data();
    bases[1] = buf[1].data();
    l.layer_base = bases;
    l.stride_kv = int64_t(kBlocks) * kBS * kH * kD;
    l.stride_block = int64_t(kBS) * kH * kD;
    l.stride_offset = kH * kD;
    l.stride_head = kD;
    l.stride_dim = 1;
    l.block_size = kBS;
    l.slot_mapping = slots.data();
    return l;
  };
  void* bs[2];
  void* bd[2];
  auto ls = layout(src, slots_a, bs);
  auto ld = layout(dst, slots_b, bd);
  auto tok = doc_tokens(11, kTokens);
  uint32_t stored = 0, loaded = 0;
  ASSERT_EQ(kdn_store_from(a.c, a.m, tok.data(), tok.size(), 0, 3, &ls, &stored), KDN_OK);
  EXPECT_EQ(stored, 3u);
  ASSERT_EQ(in_child([&] {
              Conn b(d, desc);
              std::vector<std::vector<uint16_t>> out(2, std::vector<uint16_t>(layer_elems));
              void* bo[2];
              auto lo = layout(out, slots_b, bo);
              uint32_t n = 0;
              if (kdn_retrieve_to(b.c, b.m, tok.data(), tok.size(), 0, &lo, &n) != KDN_OK || n != 3) return 1;
              // Token t of the source's odd blocks must now sit in the even blocks.
              for (int l = 0; l < 2; ++l)
                for (int kv = 0; kv < 2; ++kv)
                  for (int t = 0; t < kTokens; ++t)
                    for (int e = 0; e < kH * kD; ++e) {
                      const size_t base = size_t(kv) * kBlocks * kBS * kH * kD;
                      if (out[l][base + slots_b[t] * kH * kD + e] != src[l][base + slots_a[t] * kH * kD + e]) return 2;
                    }
              return 0;
            }),
            0);
  (void)loaded;
  (void)ld;
}

TEST(Node, DaemonDeathFailsFast) {
  auto d = std::make_unique<KdndProcess>();
  Conn k(*d, tiny_model());
  ASSERT_TRUE(k.ok());
  ASSERT_EQ(store_doc(k, 1, 2), 2);
  d->kill9();
  auto tok = doc_tokens(1, 32);
  kdn_lookup_result r{};
  const uint64_t t0 = now_ns();
  const int rc = kdn_lookup(k.c, k.m, tok.data(), tok.size(), &r);
  EXPECT_EQ(rc, KDN_ERR_UNAVAILABLE) << kdn_strerror(rc);
  EXPECT_LT(now_ns() - t0, 500'000'000ull) << "an engine must not wait out the timeout";
  EXPECT_EQ(kdn_lookup(k.c, k.m, tok.data(), tok.size(), &r), KDN_ERR_UNAVAILABLE);
  kdn_connect_opts o = d->opts();
  kdn_client* c = nullptr;
  EXPECT_EQ(kdn_connect(&o, &c), KDN_ERR_UNAVAILABLE);
}

// kdnd's CPU time (user + system, clock ticks) from /proc/<pid>/stat.
uint64_t cpu_ticks(pid_t pid) {
  FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r");
  if (!f) return 0;
  char buf[1024] = {};
  const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  const char* p = std::strrchr(buf, ')');  // the command name may hold spaces
  if (!p || size_t(p - buf) >= n) return 0;
  unsigned long utime = 0, stime = 0;
  // Fields after the name: state, ppid, ..., utime is the 14th field of the line, stime the 15th.
  std::sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &utime, &stime);
  return utime + stime;
}

// Copies into the arena finish on worker threads while the loop reaps earlier ones; when the
// traffic stops, the daemon must go to sleep (it once kept waking on a drained wake fd).
TEST(Node, AnIdleDaemonSleepsAfterCopiesInTheBackground) {
  KdndProcess d({"--host-arena-bytes", "1G"});
  const auto desc = smol_model();  // 5.6 MiB chunks: copied by the workers, not inline
  Conn k(d, desc);
  ASSERT_TRUE(k.ok());
  for (uint32_t doc = 0; doc < 100; ++doc) ASSERT_EQ(store_doc(k, 1000 + doc, 4), 4);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // past the busy-poll window
  const uint64_t before = cpu_ticks(d.pid());
  std::this_thread::sleep_for(std::chrono::seconds(1));
  const uint64_t used = cpu_ticks(d.pid()) - before;
  EXPECT_LE(used, uint64_t(sysconf(_SC_CLK_TCK) / 10)) << "kdnd used " << used << " ticks of an idle second";
}

TEST(Node, GracefulShutdown) {
  KdndProcess d;
  Conn k(d, tiny_model());
  ASSERT_TRUE(k.ok());
  EXPECT_EQ(d.stop(), 0);
  EXPECT_NE(kdn_ping(k.c), KDN_OK);
}

TEST(Api, CopyChunkIsExactAtAnyAlignment) {
  std::vector<uint8_t> src((4u << 20) + 100), dst(src.size() + 64);
  for (size_t i = 0; i < src.size(); ++i) src[i] = uint8_t(i * 131 + 7);
  for (size_t size : {size_t(1), size_t(255), size_t(4096), size_t(1u << 20), size_t((3u << 20) + 37)})
    for (size_t so : {0, 1, 13})
      for (size_t dof : {0, 5, 16}) {
        std::fill(dst.begin(), dst.end(), 0xEE);
        kdn_copy_chunk(dst.data() + dof, src.data() + so, size);
        ASSERT_EQ(std::memcmp(dst.data() + dof, src.data() + so, size), 0) << size << " " << so << " " << dof;
        ASSERT_EQ(dst[dof + size], 0xEE) << "wrote past the end";
        if (dof) {
          ASSERT_EQ(dst[dof - 1], 0xEE) << "wrote before the start";
        }
      }
  kdn_copy_chunk(nullptr, src.data(), 10);  // ignored, no crash
}

}  // namespace
}  // namespace kdn::testing
