// The contract a hostile local client cannot break, tried as such a client would (a client
// written from docs/protocol.md alone): committed chunks cannot be changed by anyone but kdnd,
// a session kdnd closed writes no chunk, namespaces are a boundary, every per-session
// resource is capped with KDN_ERR_LIMIT, and a partly served request says exactly what it
// served. Real kdnd, real processes, real shared memory.
#include "kdnd_process.h"
#include "raw_client.h"
#include "testing/version_one.h"

#include <kdn/common/clock.h>
#include <kdn/common/model.h>

#include <gtest/gtest.h>
#include <kdn/common/testing/require.h>

#include <fcntl.h>
#include <linux/falloc.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <thread>
#include <vector>

namespace kdn::testing {
namespace {

using ipc::Opcode;

// What a child that faulted exits with (its SIGSEGV/SIGBUS handler's code, the same with and
// without a sanitizer that would otherwise turn the signal into its own report).
constexpr int kFaulted = 77;

void exit_on_fault(int) { _exit(kFaulted); }

// Runs `f` in a child whose memory faults end it with kFaulted; returns the child's code.
template <class F>
int in_faulting_child(F f) {
  return in_child([&] {
    struct sigaction sa {};
    sa.sa_handler = exit_on_fault;
    ::sigaction(SIGSEGV, &sa, nullptr);
    ::sigaction(SIGBUS, &sa, nullptr);
    return f();
  });
}

// Runs `attack` in a child; true if its writes went through (it returned 0), false if they
// were stopped (a fault, or it reported failure).
template <class F>
bool write_went_through(F attack) {
  return in_faulting_child(attack) == 0;
}

// Every way a client holding the arena's descriptor could change its bytes. Returns a bit per
// way that worked (0: none did).
int attack_arena(int fd, const std::byte* ro_map, uint64_t bytes) {
  int worked = 0;
  void* rw = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (rw != MAP_FAILED) {
    std::memset(rw, 0xEE, bytes);  // scribble on every committed chunk
    ::munmap(rw, bytes);
    worked |= 1;
  }
  if (::mprotect(const_cast<std::byte*>(ro_map), 4096, PROT_READ | PROT_WRITE) == 0) {
    std::memset(const_cast<std::byte*>(ro_map), 0, 4096);
    worked |= 2;
  }
  if (::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, off_t(bytes)) == 0) worked |= 4;
  std::vector<char> zeros(65536, 0);
  if (::pwrite(fd, zeros.data(), zeros.size(), 0) > 0) worked |= 8;
  char path[64];
  std::snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  const int again = ::open(path, O_RDWR);
  if (again >= 0) {
    if (::pwrite(again, zeros.data(), zeros.size(), 4096) > 0) worked |= 16;
    void* m = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, again, 0);
    if (m != MAP_FAILED) {
      std::memset(m, 0x11, bytes);
      ::munmap(m, bytes);
      worked |= 16;
    }
    ::close(again);
  }
  if (::madvise(const_cast<std::byte*>(ro_map), bytes, MADV_REMOVE) == 0) worked |= 32;
  // A plain store through the mapping the library handed out.
  if (write_went_through([&] {
        std::memset(const_cast<std::byte*>(ro_map), 0x77, 4096);
        return 0;
      }))
    worked |= 64;
  return worked;
}

TEST(Contract, CommittedChunksCannotBeChangedByAnyClient) {
  KdndProcess d;
  const kdn_model_desc desc = tiny_model();
  ASSERT_EQ(in_child([&] {
              Conn k(d, desc);
              return k.ok() && store_doc(k, 1, 4) == 4 ? 0 : 1;
            }),
            0);
  // The attacker: a session of the same namespace, holding the arena's descriptor.
  const int worked = in_child([&] {
    RawClient r(d, RawClientOptions{1 << 20, 1 << 20});
    if (!r.ok) return 100;
    const ipc::ClientRegion* arena = r.s.region(ipc::RegionKind::kHostArena);
    if (arena == nullptr) return 101;
    return attack_arena(arena->segment.fd(), arena->segment.data(), arena->segment.size());
  });
  EXPECT_EQ(worked, 0) << "bit 1 rw map, 2 mprotect, 4 hole punch, 8 pwrite, 16 re-open, 32 MADV_REMOVE, 64 store";
  // Writing through libkdn's own lease pointer faults instead of changing the chunk.
  const int through_lease = in_faulting_child([&] {
    Conn k(d, desc);
    auto tok = doc_tokens(1, 16);
    kdn_lease* l = nullptr;
    if (kdn_retrieve_lease(k.c, k.m, tok.data(), tok.size(), 0, &l) != KDN_OK || kdn_lease_chunks(l) != 1) return 1;
    std::memset(const_cast<void*>(kdn_lease_chunk_data(l, 0)), 0, 64);
    return 0;
  });
  EXPECT_EQ(through_lease, kFaulted);
  // Every byte of every chunk is still the writer's.
  EXPECT_EQ(in_child([&] {
              Conn k(d, desc);
              return verify_doc(k, 1, 4) == 4 ? 0 : 1;
            }),
            0);
  EXPECT_EQ(stats_of(d).corrupt_chunks, 0u);
}

// Blocks until the peer writes a byte on `fd` (or 20 s pass).
bool wait_byte(int fd) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, 20000) != 1) return false;
  char b;
  return ::read(fd, &b, 1) == 1;
}

TEST(Contract, ASessionKdndClosedWritesNoChunk) {
  KdndProcess d;
  const kdn_model_desc desc = tiny_model();
  int to_parent[2], to_child[2];
  ASSERT_EQ(::pipe(to_parent), 0);
  ASSERT_EQ(::pipe(to_child), 0);
  fflush(nullptr);
  const pid_t attacker = ::fork();
  if (attacker == 0) {
    RawClient r(d, RawClientOptions{1 << 20, 1 << 20});
    if (!r.ok) _exit(1);
    const uint32_t model = r.register_model(desc);
    // Stores chunk 0 of document 2 the proper way: reserve, write its staging slot, commit.
    auto info = ModelInfo::from_desc(desc);
    auto tok = doc_tokens(2, 16);
    kdn_key key;
    prefix_keys(*info, tok, std::span(&key, 1));
    std::memcpy(r.s.payload(), &key, sizeof key);
    ipc::Sqe q{};
    q.opcode = uint8_t(Opcode::kReserve);
    q.model_id = model;
    q.in_len = sizeof key;
    q.out_off = 4096;
    q.out_len = sizeof(ipc::ReserveRecord);
    if (r.call(q) != KDN_OK) _exit(2);
    ipc::ReserveRecord rec;
    std::memcpy(&rec, r.s.payload() + 4096, sizeof rec);
    auto slot = r.s.resolve(rec.slot, info->chunk_bytes, ipc::RegionKind::kStaging);
    if (!slot.ok()) _exit(3);
    fill_chunk(*slot, info->chunk_bytes, 2, 0);
    std::memcpy(r.s.payload(), &rec.reservation_id, 8);
    q = {};
    q.opcode = uint8_t(Opcode::kCommit);
    q.in_len = 8;
    if (r.call(q) != KDN_OK) _exit(4);
    // Then breaks its ring: kdnd closes the session, the process keeps every mapping.
    const auto& w = r.s.welcome();
    std::byte* base = r.s.payload() - w.payload_offset;
    reinterpret_cast<std::atomic<uint32_t>*>(base + w.sq_offset + 64)->store(0x7fff0000u);
    (void)r.s.ring_doorbell();  // kdnd may be asleep by now: it looks at the ring when woken
    bool closed = false;
    for (int i = 0; i < 500 && !closed; ++i) {
      char b;
      closed = ::recv(r.sock.get(), &b, 1, MSG_DONTWAIT) == 0;
      usleep(10000);
    }
    if (!closed) _exit(5);
    (void)!::write(to_parent[1], "c", 1);
    if (!wait_byte(to_child[0])) _exit(6);
    // Others have stored since: now write everything it can reach.
    const ipc::ClientRegion* staging = r.s.region(ipc::RegionKind::kStaging);
    std::memset(staging->segment.data(), 0xEE, staging->segment.size());
    const ipc::ClientRegion* arena = r.s.region(ipc::RegionKind::kHostArena);
    (void)attack_arena(arena->segment.fd(), arena->segment.data(), arena->segment.size());
    (void)!::write(to_parent[1], "d", 1);
    _exit(0);
  }
  ASSERT_GT(attacker, 0);
  ASSERT_TRUE(wait_byte(to_parent[0])) << "the attacker's session was not closed";
  ASSERT_EQ(in_child([&] {
              Conn k(d, desc);
              return k.ok() && store_doc(k, 3, 4) == 4 ? 0 : 1;
            }),
            0);
  (void)!::write(to_child[1], "s", 1);
  EXPECT_TRUE(wait_byte(to_parent[0]));
  int st = 0;
  ::waitpid(attacker, &st, 0);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "attacker status " << st;
  EXPECT_EQ(in_child([&] {
              Conn k(d, desc);
              if (verify_doc(k, 2, 1) != 1) return 1;   // committed before the close
              return verify_doc(k, 3, 4) == 4 ? 0 : 2;  // stored after it
            }),
            0);
  for (int fd : {to_parent[0], to_parent[1], to_child[0], to_child[1]}) ::close(fd);
}

// A configuration with two tenants of other uids; the test acts as those uids.
class Tenants : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::getuid() != 0) KDN_SKIP_OR_FAIL("ROOT", "acting as other uids needs root");
    char tmpl[] = "/tmp/kdn-tenants-XXXXXX";
    conf_dir_ = ::mkdtemp(tmpl);
    conf_ = conf_dir_ + "/kdnd.toml";
    std::ofstream f(conf_);
    f << "[namespace.default]\n"
         "[namespace.team-a]\nallow_uids = [4101]\n"
         "[namespace.team-b]\nallow_uids = [4102]\nadmin_uids = [4102]\n";
  }
  void TearDown() override {
    if (!conf_dir_.empty()) (void)!std::system(("rm -rf " + conf_dir_).c_str());
  }
  // Lets other uids reach the socket (the daemon made its directory 0700).
  static void open_to_others(const KdndProcess& d) {
    ::chmod(d.dir().c_str(), 0755);
    ::chmod(d.socket().c_str(), 0777);
  }
  template <class F>
  static int as_uid(uid_t uid, F f) {
    return in_child([&] {
      if (::setgid(uid) != 0 || ::setuid(uid) != 0) return 99;
      return f();
    });
  }
  std::string conf_dir_, conf_;
};

int refusal(const KdndProcess& d, const char* ns, uint32_t flags = 0) {
  RawClient r(d, RawClientOptions{1 << 20, 0, ns, "", flags});
  return r.ok ? KDN_OK : r.refused.raw();
}

TEST_F(Tenants, ANamespaceOpensOnlyToItsUidsAndAdminComesFromConfiguration) {
  KdndProcess d({"--config", conf_});
  open_to_others(d);
  EXPECT_EQ(as_uid(4101,
                   [&] {
                     RawClient mine(d, RawClientOptions{1 << 20, 0, "team-a", "", ipc::kHelloFlagAdmin});
                     if (!mine.ok) return 1;
                     if (mine.admin()) return 2;  // asked for, not configured: not granted
                     ipc::Sqe q{};
                     q.opcode = uint8_t(Opcode::kList);
                     q.out_len = 4096;
                     if (mine.call(q) != KDN_ERR_PERMISSION) return 3;
                     if (refusal(d, "team-b") != KDN_ERR_PERMISSION) return 4;  // another tenant's
                     if (refusal(d, "default") != KDN_ERR_PERMISSION) return 5;
                     if (refusal(d, "typo") != KDN_ERR_NOT_FOUND) return 6;  // no namespace appears
                     if (refusal(d, "mine", ipc::kHelloFlagCreateNamespace) != KDN_ERR_PERMISSION) return 7;
                     return 0;
                   }),
            0);
  EXPECT_EQ(as_uid(4102,
                   [&] {
                     RawClient admin(d, RawClientOptions{1 << 20, 0, "team-b", "", ipc::kHelloFlagAdmin});
                     if (!admin.ok || !admin.admin()) return 1;  // configured: granted
                     ipc::Sqe q{};
                     q.opcode = uint8_t(Opcode::kList);
                     q.out_off = 0;
                     q.out_len = 4096;
                     return admin.call(q) == KDN_OK ? 0 : 2;
                   }),
            0);
  const kdn_stats s = stats_of(d);  // root, the daemon's uid: admin by default
  EXPECT_EQ(s.daemon_namespaces, 3u) << "the refused names created nothing";
  EXPECT_GE(s.daemon_handshakes_refused, 4u) << "team-b, default, typo, mine";
}

// Opens `n` connections that never say hello; returns them (those connect() accepted).
std::vector<ipc::UniqueFd> silent_connections(const KdndProcess& d, int n) {
  std::vector<ipc::UniqueFd> fds;
  for (int i = 0; i < n; ++i) {
    auto fd = ipc::uds_connect(d.socket(), 2000);
    if (fd.ok()) fds.push_back(std::move(*fd));
  }
  return fds;
}

// What kdnd said on a silent connection within `ms`: the refusal's status, 1 if the
// connection is still open and quiet, 2 if it closed without a word.
int what_kdnd_said(int fd, uint32_t ms) {
  std::byte buf[512];
  auto m = ipc::recv_message(fd, buf, 0, ms);
  if (!m.ok()) return m.status().code() == Code::kTimeout ? 1 : 2;
  if (m->bytes < 8) return 2;
  int32_t status;
  std::memcpy(&status, buf + 4, sizeof status);  // magic, then status, as in every welcome
  return status;
}

// The engine of another uid connects, while `hold` keeps its connections open.
TEST_F(Tenants, AUidAdmittedNowhereIsCutOffAtAccept) {
  KdndProcess d({"--config", conf_, "--set", "max_sessions=8", "--set", "handshake_timeout_ms=30000"});
  open_to_others(d);
  int to_parent[2], to_child[2];
  ASSERT_EQ(::pipe(to_parent), 0);
  ASSERT_EQ(::pipe(to_child), 0);
  const pid_t flooder = ::fork();
  if (flooder == 0) {
    if (::setgid(4199) != 0 || ::setuid(4199) != 0) _exit(99);
    auto fds = silent_connections(d, 600);
    if (fds.size() != 600) _exit(98);
    (void)!::write(to_parent[1], "h", 1);
    int refused = 0;  // each is told KDN_ERR_PERMISSION at once, long before the 30 s timeout
    const uint64_t t0 = now_ns();
    for (auto& fd : fds) refused += what_kdnd_said(fd.get(), 1000) == KDN_ERR_PERMISSION;
    const bool quick = now_ns() - t0 < 10'000'000'000ull;
    char c;
    (void)!::read(to_child[0], &c, 1);  // hold them until the parent has connected
    _exit(refused == 600 && quick ? 0 : 1);
  }
  char c;
  ASSERT_EQ(::read(to_parent[0], &c, 1), 1) << "the flooder could not open its connections";
  const uint64_t t0 = now_ns();
  EXPECT_EQ(as_uid(4102, [&] { return RawClient(d, RawClientOptions{1 << 20, 0, "team-b"}).ok ? 0 : 1; }), 0);
  Conn engine(d, tiny_model());
  EXPECT_TRUE(engine.ok()) << engine.connect_status;
  EXPECT_LT(now_ns() - t0, 5'000'000'000ull) << "engines waited behind the flood";
  (void)!::write(to_child[1], "g", 1);
  int st = 0;
  ::waitpid(flooder, &st, 0);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "flooder status " << st;
  EXPECT_GE(stats_of(d).daemon_handshakes_refused, 600u);
  for (int fd : {to_parent[0], to_parent[1], to_child[0], to_child[1]}) ::close(fd);
}

TEST_F(Tenants, SilentConnectionsOfOneUidDoNotLockOutOthers) {
  KdndProcess d({"--config", conf_, "--set", "max_sessions=8", "--set", "handshake_timeout_ms=30000", "--set",
                 "max_pending_handshakes_per_uid=16"});
  open_to_others(d);
  int to_parent[2], to_child[2];
  ASSERT_EQ(::pipe(to_parent), 0);
  ASSERT_EQ(::pipe(to_child), 0);
  const pid_t flooder = ::fork();
  if (flooder == 0) {  // uid 4101 may open team-a: its silent connections wait, up to its cap
    if (::setgid(4101) != 0 || ::setuid(4101) != 0) _exit(99);
    auto fds = silent_connections(d, 600);
    if (fds.size() != 600) _exit(98);
    // Refusals come as kdnd accepts; a connection still quiet is looked at again.
    std::vector<int> said(fds.size(), 1);
    int waiting = 0, busy = 0;
    for (int round = 0; round < 100 && busy < 584; ++round) {
      if (round) std::this_thread::sleep_for(std::chrono::milliseconds(100));
      waiting = busy = 0;
      for (size_t i = 0; i < fds.size(); ++i) {
        if (said[i] == 1) said[i] = what_kdnd_said(fds[i].get(), 0);
        waiting += said[i] == 1;
        busy += said[i] == KDN_ERR_BUSY;
      }
    }
    (void)!::write(to_parent[1], "h", 1);
    char c;
    (void)!::read(to_child[0], &c, 1);
    _exit(waiting == 16 && busy == 584 ? 0 : 1);
  }
  char c;
  ASSERT_EQ(::read(to_parent[0], &c, 1), 1);
  EXPECT_EQ(as_uid(4102,
                   [&] {
                     return RawClient(d, RawClientOptions{1 << 20, 0, "team-b"}).ok ? 0 : 1;
                   }),
            0)
      << "another uid's engine connects while 16 silent connections wait";
  Conn engine(d, tiny_model());
  EXPECT_TRUE(engine.ok()) << engine.connect_status;
  (void)!::write(to_child[1], "g", 1);
  int st = 0;
  ::waitpid(flooder, &st, 0);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "16 should wait and 584 be refused; status " << st;
  EXPECT_EQ(as_uid(4101,
                   [&] {
                     for (int i = 0; i < 100; ++i) {  // once kdnd has seen the silent ones close
                       if (RawClient(d, RawClientOptions{1 << 20, 0, "team-a"}).ok) return 0;
                       std::this_thread::sleep_for(std::chrono::milliseconds(20));
                     }
                     return 1;
                   }),
            0)
      << "the silent connections closed: the uid's own engine gets in";
  for (int fd : {to_parent[0], to_parent[1], to_child[0], to_child[1]}) ::close(fd);
}

TEST(Contract, RepeatedLeasesOfOneChunkAreOneCountedLease) {
  KdndProcess d({"--set", "max_lease_count=1000", "--set", "max_leases=64"});
  const kdn_model_desc desc = tiny_model();
  Conn k(d, desc);
  ASSERT_TRUE(k.ok());
  ASSERT_EQ(store_doc(k, 1, 2), 2);
  auto tok = doc_tokens(1, 32);
  std::vector<kdn_lease*> held;
  for (int i = 0; i < 1000; ++i) {
    kdn_lease* l = nullptr;
    ASSERT_EQ(kdn_retrieve_lease(k.c, k.m, tok.data(), tok.size(), 1, &l), KDN_OK) << i;
    ASSERT_EQ(kdn_lease_chunks(l), 1u);
    held.push_back(l);
  }
  kdn_lease* over = nullptr;
  EXPECT_EQ(kdn_retrieve_lease(k.c, k.m, tok.data(), tok.size(), 1, &over), KDN_ERR_LIMIT);
  kdn_stats s{};
  s.struct_size = sizeof s;
  ASSERT_EQ(kdn_get_stats(k.c, &s), KDN_OK);
  EXPECT_EQ(s.active_leases, 1u) << "1000 leases of one chunk by one session are one pin";
  EXPECT_GE(s.limit_errors, 1u);
  for (kdn_lease* l : held) ASSERT_EQ(kdn_lease_release(k.c, l), KDN_OK);
  ASSERT_EQ(kdn_get_stats(k.c, &s), KDN_OK);
  EXPECT_EQ(s.active_leases, 0u);
  // More distinct chunks than max_leases in one request: refused whole.
  ASSERT_EQ(store_doc(k, 5, 70), 70);
  auto big = doc_tokens(5, 70 * 16);
  kdn_lease* l = nullptr;
  EXPECT_EQ(kdn_retrieve_lease(k.c, k.m, big.data(), big.size(), 0, &l), KDN_ERR_LIMIT);
  ASSERT_EQ(kdn_get_stats(k.c, &s), KDN_OK);
  EXPECT_EQ(s.active_leases, 0u) << "nothing taken";
}

TEST(Contract, ReservationsAreCappedAndExpire) {
  KdndProcess d({"--set", "max_reservations=8", "--set", "reservation_timeout_ms=300"});
  const kdn_model_desc desc = tiny_model();
  Conn k(d, desc);
  ASSERT_TRUE(k.ok());
  auto tok = doc_tokens(4, 16 * 16);
  kdn_store* s = nullptr;
  EXPECT_EQ(kdn_store_reserve(k.c, k.m, tok.data(), tok.size(), 0, 9, &s), KDN_ERR_LIMIT);
  ASSERT_EQ(kdn_store_reserve(k.c, k.m, tok.data(), tok.size(), 0, 8, &s), KDN_OK);
  kdn_store* more = nullptr;
  EXPECT_EQ(kdn_store_reserve(k.c, k.m, tok.data(), tok.size(), 8, 1, &more), KDN_ERR_LIMIT);
  // Never committed: kdnd takes the slots back after the timeout.
  kdn_stats st{};
  st.struct_size = sizeof st;
  for (int i = 0; i < 100; ++i) {
    ASSERT_EQ(kdn_get_stats(k.c, &st), KDN_OK);
    if (st.open_reservations == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(st.open_reservations, 0u);
  EXPECT_EQ(st.expired_reservations, 8u);
  EXPECT_EQ(kdn_store_commit(k.c, s), KDN_ERR_NOT_FOUND) << "a commit after the timeout names no reservation";
  EXPECT_EQ(store_doc(k, 4, 8), 8) << "the slots are usable again";
}

TEST(Contract, TheModelTableChurnsInsteadOfFillingUp) {
  KdndProcess d({"--set", "max_models_total=4", "--set", "max_models=2"});
  for (uint32_t i = 0; i < 24; ++i) {
    Conn k(d, tiny_model(16 + i));
    ASSERT_EQ(k.register_status, KDN_OK) << "model " << i << ": freed slots are reused";
  }
  Conn a(d, tiny_model(100));
  kdn_model* m = nullptr;
  kdn_model_desc second = tiny_model(101), third = tiny_model(102);
  ASSERT_EQ(kdn_register_model(a.c, &second, &m), KDN_OK);
  EXPECT_EQ(kdn_register_model(a.c, &third, &m), KDN_ERR_LIMIT) << "max_models per session";
  Conn b(d, tiny_model(103));
  ASSERT_EQ(kdn_register_model(b.c, &third, &m), KDN_OK);  // the table holds 4 now
  Conn c(d, tiny_model(104));
  EXPECT_EQ(c.register_status, KDN_ERR_LIMIT) << "max_models_total";
}

TEST(Contract, ClientNamespacesAreCappedAndReleasedWithTheirMemory) {
  KdndProcess d({"--set", "max_namespaces=3", "--set", "namespace_grace_s=1"});
  const kdn_model_desc desc = tiny_model();
  {
    Conn a(d, desc, "a"), b(d, desc, "b");
    ASSERT_TRUE(a.ok() && b.ok());
    ASSERT_EQ(store_doc(a, 1, 2), 2);
    Conn c(d, desc, "c");
    EXPECT_EQ(c.connect_status, KDN_ERR_LIMIT);
  }
  // Without sessions for the grace period, a and b go; then c fits.
  int status = KDN_ERR_LIMIT;
  for (int i = 0; i < 100 && status != KDN_OK; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    Conn c(d, desc, "c");
    status = c.connect_status;
  }
  EXPECT_EQ(status, KDN_OK);
  kdn_connect_opts o = d.opts("a");
  o.flags = 0;
  kdn_client* cl = nullptr;
  EXPECT_EQ(kdn_connect(&o, &cl), KDN_ERR_NOT_FOUND) << "released";
  Conn again(d, desc, "a");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(verify_doc(again, 1, 2), 0) << "a released namespace's chunks went with it";
}

TEST(Contract, SessionsPerUidAreCapped) {
  KdndProcess d({"--set", "max_sessions_per_uid=3"});
  std::vector<std::unique_ptr<Conn>> open;
  for (int i = 0; i < 3; ++i) {
    open.push_back(std::make_unique<Conn>(d, tiny_model()));
    ASSERT_TRUE(open.back()->ok());
  }
  Conn fourth(d, tiny_model());
  EXPECT_EQ(fourth.connect_status, KDN_ERR_LIMIT);
  open.pop_back();
  Conn fifth(d, tiny_model());
  EXPECT_TRUE(fifth.ok()) << "a closed session frees its place";
}

TEST(Contract, APartialReserveZeroesTheRecordsItDidNotServe) {
  KdndProcess d({"--host-arena-bytes", "32M"});
  RawClient r(d, RawClientOptions{1 << 20, 64ull << 20});
  ASSERT_TRUE(r.ok);
  const kdn_model_desc desc = smol_model();  // 5.625 MiB chunks: 4 fit in 32 MiB of 16 MiB slabs
  const uint32_t model = r.register_model(desc);
  ASSERT_NE(model, 0u);
  for (uint32_t i = 0; i < 8; ++i) {
    const kdn_key k{i + 1, 77};
    std::memcpy(r.s.payload() + i * sizeof k, &k, sizeof k);
  }
  std::memset(r.s.payload() + 4096, 0xEE, 8 * sizeof(ipc::ReserveRecord));  // stale bytes
  ipc::Sqe q{};
  q.opcode = uint8_t(Opcode::kReserve);
  q.model_id = model;
  q.in_len = 8 * sizeof(kdn_key);
  q.out_off = 4096;
  q.out_len = 8 * sizeof(ipc::ReserveRecord);
  ipc::Cqe c{};
  ASSERT_EQ(r.call(q, &c), KDN_OK);
  auto res = ipc::ReserveOp::result(c, 8);
  ASSERT_TRUE(res.ok());
  EXPECT_EQ(res->served, 4u);
  EXPECT_EQ(res->stop, KDN_ERR_NO_SPACE);
  ipc::ReserveRecord recs[8], zero{};
  std::memcpy(recs, r.s.payload() + 4096, sizeof recs);
  for (uint32_t i = 0; i < 4; ++i) EXPECT_EQ(recs[i].state, uint32_t(ipc::ReserveState::kReserved)) << i;
  for (uint32_t i = 4; i < 8; ++i) EXPECT_EQ(std::memcmp(&recs[i], &zero, sizeof zero), 0) << i;
}

TEST(Contract, AVersionOneClientIsToldTheVersion) {
  KdndProcess d;
  auto fd = ipc::uds_connect(d.socket(), 1000);
  ASSERT_TRUE(fd.ok());
  ASSERT_TRUE(ipc::send_message(fd->get(), ipc::testing::version_one_hello(), {}).ok());
  auto seen = ipc::testing::read_refusal(fd->get(), 2000);
  ASSERT_TRUE(seen.ok());
  EXPECT_EQ(seen->bytes, 80u);
  EXPECT_EQ(seen->fds, 0u);
  EXPECT_EQ(seen->status, KDN_ERR_VERSION);
  EXPECT_EQ(seen->proto_major, 2u);
  Conn k(d, tiny_model());
  EXPECT_TRUE(k.ok()) << "kdnd serves version-2 clients on";
}

}  // namespace
}  // namespace kdn::testing
