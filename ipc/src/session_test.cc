// Both ends of a session in two processes: handshake over a real socket, SQEs and CQEs
// through the rings, the daemon sleeping in epoll between bursts, the client sleeping on
// the CQ tail, hang-up detection. The daemon side here is a toy that answers PING and a
// LOOKUP-shaped request; the real request handling lives in sidecar/.
#include <kdn/common/clock.h>
#include <kdn/ipc/session.h>

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "testing/fork_child.h"

namespace kdn::ipc {
namespace {

SessionLimits test_limits() {
  SessionLimits l{};
  l.max_leases = l.max_lease_count = l.max_reservations = l.max_in_flight = l.max_models = 16;
  l.reservation_timeout_ms = 1000;
  return l;
}

using testing::fork_child;
using testing::wait_child;

constexpr uint64_t kSecond = 1'000'000'000ull;
constexpr uint64_t kArenaPattern = 0x6B646E6172656E61ull;

class SessionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kdn-session-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    path_ = dir_ + "/kdnd.sock";
    auto l = uds_listen(path_);
    ASSERT_TRUE(l.ok()) << l.status().what();
    listener_ = std::move(*l);
  }
  void TearDown() override {
    ::unlink(path_.c_str());
    ::rmdir(dir_.c_str());
  }
  UniqueFd accept_one() {
    for (int i = 0; i < 10'000; ++i) {
      auto c = uds_accept(listener_.get());
      if (!c.ok()) return UniqueFd();
      if (c->valid()) return std::move(*c);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return UniqueFd();
  }
  std::string dir_, path_;
  UniqueFd listener_;
};

// ---- the toy daemon --------------------------------------------------------------------------
Cqe answer(const DaemonSession& s, const Sqe& q) {
  Cqe c{};
  c.user_data = q.user_data;
  auto shape = check_sqe(q, s.payload().size(), false);
  if (!shape.ok()) {
    c.status = shape.status().raw();
    return c;
  }
  if (q.opcode == static_cast<uint8_t>(Opcode::kPing)) {
    c.res[0] = q.arg[0];
  } else if (q.opcode == static_cast<uint8_t>(Opcode::kLookup)) {
    std::vector<kdn_key> keys(kMaxKeysPerOp);
    auto got = s.payload().copy_in_records<kdn_key>(q, keys);
    if (!got.ok()) {
      c.status = got.status().raw();
      return c;
    }
    c.res[0] = got->size();
    for (const kdn_key& k : *got) c.res[1] += k.lo;
  } else {
    c.status = KDN_ERR_UNSUPPORTED;
  }
  return c;
}

struct ServeStats {
  uint64_t completions = 0, sleeps = 0;
  Status end;
};

// Serves until the client hangs up; after kIdleSpinNs without work it sleeps in epoll.
constexpr uint64_t kIdleSpinNs = 50'000;

ServeStats serve(DaemonSession& s, int sock) {
  ServeStats st;
  auto poller = EventPoller::create();
  if (!poller.ok() || !poller->add(s.doorbell().fd(), 1).ok() || !poller->add(sock, 2).ok()) {
    st.end = Status(Code::kInternal, "poller setup");
    return st;
  }
  Sqe sqes[32];
  Cqe cqes[32];
  uint64_t idle_since = now_ns();
  for (;;) {
    auto n = s.poll(sqes);
    if (!n.ok()) return st.end = n.status(), st;
    for (uint32_t i = 0; i < *n; ++i) cqes[i] = answer(s, sqes[i]);
    if (*n > 0) {
      auto done = s.complete(std::span<const Cqe>(cqes, *n));
      if (!done.ok() || *done != *n) return st.end = Status(Code::kInternal, "CQ overflow"), st;
      st.completions += *n;
      idle_since = now_ns();
      continue;
    }
    if (now_ns() - idle_since < kIdleSpinNs) {
      cpu_relax();
      continue;
    }
    s.set_sleeping(true);
    sleep_fence();
    auto pending = s.pending();
    if (!pending.ok()) return st.end = pending.status(), st;
    if (*pending == 0) {
      ++st.sleeps;
      uint64_t tags[2];
      auto ready = poller->wait(tags, 10'000);
      if (!ready.ok()) return st.end = ready.status(), st;
      for (size_t i = 0; i < *ready; ++i) {
        if (tags[i] != 2) continue;
        std::byte b[8];
        auto m = recv_message(sock, b, 0, 0);
        if (!m.ok() && m.status().code() == Code::kUnavailable) return st.end = OkStatus(), st;
      }
      (void)s.doorbell().drain();
    }
    s.set_sleeping(false);
  }
}

// ---- the client (runs in the child) ------------------------------------------------------------
int round_trip(ClientSession& c, const Sqe& q, Cqe& out) {
  auto pushed = c.submit(std::span(&q, 1));
  if (!pushed.ok() || *pushed != 1) return 10;
  if (!c.wait_for_completion(5 * kSecond).ok()) return 11;
  auto got = c.reap(std::span(&out, 1));
  if (!got.ok() || *got != 1 || out.user_data != q.user_data) return 12;
  return 0;
}

int ping_many(ClientSession& c, uint32_t n, uint32_t pause_every) {
  uint64_t start = now_ns();
  for (uint32_t i = 0; i < n; ++i) {
    Sqe q{};
    q.opcode = static_cast<uint8_t>(Opcode::kPing);
    q.user_data = i;
    q.arg[0] = i * 3ull;
    Cqe r;
    if (int rc = round_trip(c, q, r); rc != 0) return rc;
    if (r.status != KDN_OK || r.res[0] != i * 3ull) return 20;
    // Idle gaps: the daemon goes to sleep and must be woken by the doorbell.
    if (pause_every != 0 && i % pause_every == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  std::printf("[ session ] %u pings (pause every %u): %.2f us per round trip\n", n, pause_every,
              static_cast<double>(now_ns() - start) / 1e3 / n);
  return 0;
}

int lookups_and_errors(ClientSession& c) {
  kdn_key keys[100];
  for (uint64_t i = 0; i < 100; ++i) keys[i] = kdn_key{i, ~i};
  std::memcpy(c.payload() + 4096, keys, sizeof(keys));
  Sqe q{};
  q.opcode = static_cast<uint8_t>(Opcode::kLookup);
  q.user_data = 7;
  q.in_off = 4096;
  q.in_len = sizeof(keys);
  Cqe r;
  if (round_trip(c, q, r) != 0 || r.status != KDN_OK || r.res[0] != 100 || r.res[1] != 4950) return 30;
  q.in_off = c.payload_bytes() - 8;  // runs past the payload area
  if (round_trip(c, q, r) != 0 || r.status != KDN_ERR_PROTOCOL) return 31;
  Sqe unknown{};
  unknown.opcode = 99;
  unknown.user_data = 8;
  if (round_trip(c, unknown, r) != 0 || r.status != KDN_ERR_UNSUPPORTED) return 32;
  return 0;  // the session is still usable: the caller pings again
}

int burst(ClientSession& c) {
  std::vector<Sqe> qs(c.ring_entries());
  for (size_t i = 0; i < qs.size(); ++i) {
    qs[i] = Sqe{};
    qs[i].opcode = static_cast<uint8_t>(Opcode::kPing);
    qs[i].user_data = 1000 + i;
  }
  auto pushed = c.submit(qs);
  if (!pushed.ok() || *pushed != qs.size()) return 40;
  std::vector<Cqe> cs(qs.size());
  size_t got = 0;
  while (got < cs.size()) {
    if (!c.wait_for_completion(5 * kSecond).ok()) return 41;
    auto n = c.reap(std::span(cs).subspan(got));
    if (!n.ok()) return 42;
    got += *n;
  }
  for (size_t i = 0; i < cs.size(); ++i) {
    if (cs[i].user_data != 1000 + i || cs[i].status != KDN_OK) return 43;
  }
  return 0;
}

int run_client(const std::string& path) {
  auto sock = uds_connect(path, 5000);
  if (!sock.ok()) return 1;
  HelloRequest req;
  req.name_space = "test";
  req.ring_entries = 64;
  req.payload_bytes = 256 << 10;
  auto hello = make_hello(req);
  if (!hello.ok()) return 2;
  auto hs = client_handshake(sock->get(), *hello, 5000);
  if (!hs.ok()) return 3;
  auto session = ClientSession::attach(std::move(*hs));
  if (!session.ok()) return 4;
  const ClientRegion* arena = session->region(RegionKind::kHostArena);
  if (arena == nullptr) return 5;
  uint64_t pattern;
  std::memcpy(&pattern, arena->segment.data(), sizeof(pattern));
  if (pattern != kArenaPattern) return 5;
  // The arena is mapped read-only: a slot reference resolves, a stale one does not.
  const SlotRef ok{arena->record.region_id, arena->record.generation, 0};
  if (!session->resolve(ok, 8, RegionKind::kHostArena).ok()) return 6;
  const SlotRef stale{arena->record.region_id, arena->record.generation + 1, 0};
  if (session->resolve(stale, 8, RegionKind::kHostArena).status().code() != Code::kProtocol) return 7;
  const SlotRef outside{arena->record.region_id, arena->record.generation, arena->segment.size() - 4};
  if (session->resolve(outside, 8, RegionKind::kHostArena).ok()) return 8;
  if (int rc = ping_many(*session, 20'000, 0); rc != 0) return rc;
  if (int rc = ping_many(*session, 2'000, 1); rc != 0) return rc;
  if (int rc = lookups_and_errors(*session); rc != 0) return rc;
  if (int rc = burst(*session); rc != 0) return rc;
  return ping_many(*session, 100, 0);
}

TEST_F(SessionTest, FullSessionAcrossProcesses) {
  pid_t child = fork_child([&] { return run_client(path_); });
  ASSERT_GT(child, 0);
  UniqueFd conn = accept_one();
  ASSERT_TRUE(conn.valid());
  auto rh = server_receive_hello(conn.get(), 5000);
  ASSERT_TRUE(rh.ok()) << rh.status().what();
  EXPECT_STREQ(rh->hello.name_space, "test");
  auto layout = SessionLayout::compute(rh->hello.ring_entries, rh->hello.payload_bytes);
  ASSERT_TRUE(layout.ok());
  auto session = DaemonSession::create(*layout, 42);
  auto arena = SharedSegment::create("test-arena", 1 << 20);
  ASSERT_TRUE(session.ok() && arena.ok());
  std::memcpy(arena->data(), &kArenaPattern, sizeof(kArenaPattern));
  const RegionRecord regions[1] = {
      {11, 3, uint32_t(RegionKind::kHostArena), uint32_t(RegionAccess::kRead), arena->size(), 0}};
  WelcomeMsg w = make_welcome(rh->hello, *layout, 42, 0, regions, test_limits());
  const int arena_fd = arena->fd();
  ASSERT_TRUE(
      server_send_welcome(conn.get(), w, session->segment().fd(), session->doorbell().fd(), std::span(&arena_fd, 1))
          .ok());
  ServeStats st = serve(*session, conn.get());
  EXPECT_TRUE(st.end.ok()) << st.end.what();
  EXPECT_EQ(wait_child(child, 60'000), 0);
  EXPECT_EQ(st.completions, 20'000u + 2'000u + 3u + 64u + 100u);
  EXPECT_GT(st.sleeps, 500u) << "the idle gaps must put the daemon to sleep";
  std::printf("[ session ] daemon slept %llu times\n", static_cast<unsigned long long>(st.sleeps));
}

TEST_F(SessionTest, RefusedClientGetsTheReason) {
  pid_t child = fork_child([&]() -> int {
    auto sock = uds_connect(path_, 5000);
    if (!sock.ok()) return 1;
    auto hello = make_hello(HelloRequest{});
    auto hs = client_handshake(sock->get(), *hello, 5000);
    return hs.status().code() == Code::kPermission ? 0 : 2;
  });
  ASSERT_GT(child, 0);
  UniqueFd conn = accept_one();
  ASSERT_TRUE(conn.valid());
  ASSERT_TRUE(server_receive_hello(conn.get(), 5000).ok());
  ASSERT_TRUE(server_send_refusal(conn.get(), Code::kPermission).ok());
  EXPECT_EQ(wait_child(child, 10'000), 0);
}

TEST(DaemonSession, ClientScribblingOnTheSqIsDetected) {
  auto layout = SessionLayout::compute(16, 4096);
  auto session = DaemonSession::create(*layout, 1);
  ASSERT_TRUE(session.ok());
  auto view = SharedSegment::attach(std::move(*session->segment().dup_fd()), layout->total_bytes);
  ASSERT_TRUE(view.ok());
  auto* sq = reinterpret_cast<RingHeader*>(view->data() + layout->sq_offset);
  sq->tail = 1000;  // more than 16 entries published
  Sqe out[4];
  auto n = session->poll(out);
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.status().code(), Code::kProtocol);
}

TEST(ClientSession, RefusesASegmentThatDisagreesWithTheWelcome) {
  auto layout = SessionLayout::compute(16, 4096);
  auto daemon = DaemonSession::create(*layout, 1);
  auto arena = SharedSegment::create("arena", 4096);
  ASSERT_TRUE(daemon.ok() && arena.ok());
  HelloMsg hello = *make_hello(HelloRequest{"x", "", 16, 4096, 0, 0});
  ClientHandshake hs;
  const RegionRecord regions[1] = {
      {1, 1, uint32_t(RegionKind::kHostArena), uint32_t(RegionAccess::kRead), arena->size(), 0}};
  hs.welcome = make_welcome(hello, *layout, 2 /* not the segment's id */, 0, regions, test_limits());
  hs.session_fd = std::move(*daemon->segment().dup_fd());
  hs.region_fds[0] = std::move(*arena->dup_fd());
  hs.doorbell_fd = UniqueFd(::dup(daemon->doorbell().fd()));
  auto c = ClientSession::attach(std::move(hs));
  EXPECT_EQ(c.status().code(), Code::kProtocol);
}

}  // namespace
}  // namespace kdn::ipc
