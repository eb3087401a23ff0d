#include <kdn/common/clock.h>
#include <kdn/ipc/doorbell.h>
#include <kdn/ipc/ring.h>
#include <kdn/ipc/segment.h>

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <thread>

#include "testing/fork_child.h"

namespace kdn::ipc {
namespace {

using testing::fork_child;
using testing::wait_child;

// Words shared by the two processes of a test, each on its own cache line.
struct SharedWords {
  alignas(64) uint32_t a;
  alignas(64) uint32_t a_waiting;
  alignas(64) uint32_t b;
  alignas(64) uint32_t b_waiting;
  alignas(64) uint32_t need_wakeup;
  alignas(64) uint32_t flag;
};

class SharedWordsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto seg = SharedSegment::create("doorbell-test", 1 << 20);
    ASSERT_TRUE(seg.ok());
    segment_ = std::move(*seg);
  }
  SharedWords& words() { return *reinterpret_cast<SharedWords*>(segment_.data()); }
  std::byte* after_words() { return segment_.data() + 4096; }
  SharedSegment segment_;
};

void store(uint32_t& word, uint32_t v) { std::atomic_ref<uint32_t>(word).store(v, std::memory_order_release); }
uint32_t load(uint32_t& word) { return std::atomic_ref<uint32_t>(word).load(std::memory_order_acquire); }

TEST(Futex, WaitTimesOut) {
  uint32_t word = 5;
  uint64_t start = now_ns();
  Status s = futex_wait(&word, 5, 20'000'000);
  uint64_t took = now_ns() - start;
  EXPECT_EQ(s.code(), Code::kTimeout);
  EXPECT_GE(took, 15'000'000u);
}

TEST(Futex, WaitReturnsAtOnceWhenTheValueDiffers) {
  uint32_t word = 6;
  uint64_t start = now_ns();
  EXPECT_TRUE(futex_wait(&word, 5, 5'000'000'000ull).ok());
  EXPECT_LT(now_ns() - start, 1'000'000'000u);
}

TEST_F(SharedWordsTest, FutexWakeCrossesProcesses) {
  SharedWords& w = words();
  pid_t child = fork_child([&]() -> int {
    store(w.flag, 1);  // "about to wait"
    while (load(w.a) == 0) {
      Status s = futex_wait(&w.a, 0, 10'000'000'000ull);
      if (!s.ok()) return 1;  // a 10 s timeout means the wake never arrived
    }
    return load(w.a) == 42 ? 0 : 2;
  });
  ASSERT_GT(child, 0);
  while (load(w.flag) == 0) std::this_thread::yield();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // let it reach the kernel
  store(w.a, 42);
  Result<int> woken = futex_wake(&w.a, 1);
  ASSERT_TRUE(woken.ok());
  EXPECT_EQ(wait_child(child, 20'000), 0);
}

// Ping-pong through two "CQ tail" words with the full waiter protocol. A lost wakeup shows
// up as a 5 s timeout in one of the processes.
void ping_pong(SharedWords& w, uint64_t spin_ns, uint32_t rounds) {
  pid_t child = fork_child([&]() -> int {
    CompletionWaiter wait_a(&w.a, &w.a_waiting, spin_ns);
    for (uint32_t i = 1; i <= rounds; ++i) {
      while (load(w.a) != i) {
        if (!wait_a.wait(i - 1, 5'000'000'000ull).ok()) return 1;
      }
      store(w.b, i);
      if (!wake_if_waiting(&w.b_waiting, &w.b).ok()) return 2;
    }
    return 0;
  });
  ASSERT_GT(child, 0);
  CompletionWaiter wait_b(&w.b, &w.b_waiting, spin_ns);
  uint64_t start = now_ns();
  bool ok = true;
  for (uint32_t i = 1; i <= rounds && ok; ++i) {
    store(w.a, i);
    ok = wake_if_waiting(&w.a_waiting, &w.a).ok();
    while (ok && load(w.b) != i) ok = wait_b.wait(i - 1, 5'000'000'000ull).ok();
  }
  double us = static_cast<double>(now_ns() - start) / 1e3 / rounds;
  EXPECT_TRUE(ok) << "parent missed a wakeup";
  EXPECT_EQ(wait_child(child, 60'000), 0) << "child missed a wakeup";
  std::printf("[ doorbell ] spin %llu ns: %u round trips, %.2f us each\n", static_cast<unsigned long long>(spin_ns),
              rounds, us);
}

TEST_F(SharedWordsTest, CompletionWaiterSleepingPingPongLosesNoWakeup) { ping_pong(words(), 0, 20'000); }

TEST_F(SharedWordsTest, CompletionWaiterSpinningPingPong) { ping_pong(words(), kDefaultSpinNs, 5000); }

TEST(EventDoorbell, RingAndDrain) {
  auto bell = EventDoorbell::create();
  ASSERT_TRUE(bell.ok());
  EXPECT_EQ(*bell->drain(), 0u) << "nothing rung yet";
  ASSERT_TRUE(bell->ring().ok());
  ASSERT_TRUE(bell->ring().ok());
  EXPECT_EQ(*bell->drain(), 2u);
  EXPECT_EQ(*bell->drain(), 0u);
}

TEST(EventDoorbell, AdoptRefusesOtherDescriptors) {
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  ::close(pipe_fds[1]);
  auto from_pipe = EventDoorbell::adopt(UniqueFd(pipe_fds[0]));
  EXPECT_EQ(from_pipe.status().code(), Code::kProtocol);
  auto from_memfd = EventDoorbell::adopt(UniqueFd(::memfd_create("x", MFD_CLOEXEC)));
  EXPECT_EQ(from_memfd.status().code(), Code::kProtocol);
  EXPECT_EQ(EventDoorbell::adopt(UniqueFd()).status().code(), Code::kProtocol);
  auto bell = EventDoorbell::create();
  ASSERT_TRUE(bell.ok());
  UniqueFd dup(::dup(bell->fd()));
  EXPECT_TRUE(EventDoorbell::adopt(std::move(dup)).ok());
}

TEST(EventPoller, ReportsTheTagOfARungDoorbell) {
  auto poller = EventPoller::create();
  auto a = EventDoorbell::create();
  auto b = EventDoorbell::create();
  ASSERT_TRUE(poller.ok() && a.ok() && b.ok());
  ASSERT_TRUE(poller->add(a->fd(), 11).ok());
  ASSERT_TRUE(poller->add(b->fd(), 22).ok());
  uint64_t tags[4];
  EXPECT_EQ(*poller->wait(tags, 0), 0u);
  ASSERT_TRUE(b->ring().ok());
  Result<size_t> n = poller->wait(tags, 1000);
  ASSERT_TRUE(n.ok());
  ASSERT_EQ(*n, 1u);
  EXPECT_EQ(tags[0], 22u);
  ASSERT_TRUE(b->drain().ok());
  EXPECT_EQ(*poller->wait(tags, 0), 0u) << "drained: no longer ready";
  EXPECT_TRUE(poller->remove(a->fd()).ok());
  EXPECT_FALSE(poller->remove(a->fd()).ok());
}

// The daemon's sleep protocol under stress: a consumer process that sleeps in epoll whenever
// its ring is empty, and a producer that kicks the doorbell only when need_wakeup is set. If
// a wakeup were lost, the consumer would sleep through its 3 s epoll timeout with entries
// pending, which it reports as a failure.
TEST_F(SharedWordsTest, NeedWakeupProtocolLosesNoWakeupUnderStress) {
  constexpr uint32_t kCap = 64;
  constexpr uint64_t kTotal = 200'000;
  SharedWords& w = words();
  std::byte* region = after_words();
  auto bell = EventDoorbell::create();
  ASSERT_TRUE(bell.ok());
  pid_t child = fork_child([&]() -> int {
    auto ring = RingConsumer<uint64_t>::attach(region, ring_region_bytes(kCap, 8), kCap);
    auto poller = EventPoller::create();
    if (!ring.ok() || !poller.ok() || !poller->add(bell->fd(), 1).ok()) return 1;
    uint64_t next = 0, sleeps = 0;
    uint64_t batch[kCap];
    while (next < kTotal) {
      Result<uint32_t> n = ring->try_pop_n(batch);
      if (!n.ok()) return 2;
      for (uint32_t i = 0; i < *n; ++i) {
        if (batch[i] != next++) return 3;
      }
      if (*n > 0) continue;
      set_need_wakeup(&w.need_wakeup, true);
      sleep_fence();
      Result<uint32_t> pending = ring->available();
      if (!pending.ok()) return 4;
      if (*pending == 0) {
        ++sleeps;
        uint64_t tag;
        Result<size_t> ready = poller->wait(std::span(&tag, 1), 3000);
        if (!ready.ok()) return 5;
        if (*ready == 0 && *ring->available() > 0) return 6;  // lost wakeup
        if (!bell->drain().ok()) return 7;
      }
      set_need_wakeup(&w.need_wakeup, false);
    }
    store(w.flag, static_cast<uint32_t>(sleeps));
    return 0;
  });
  ASSERT_GT(child, 0);
  auto ring = RingProducer<uint64_t>::attach(region, ring_region_bytes(kCap, 8), kCap);
  ASSERT_TRUE(ring.ok());
  uint64_t kicks = 0;
  for (uint64_t next = 0; next < kTotal;) {
    Result<bool> pushed = ring->try_push(next);
    ASSERT_TRUE(pushed.ok());
    if (!*pushed) {
      std::this_thread::yield();
      continue;
    }
    ++next;
    kicks += load(w.need_wakeup);
    ASSERT_TRUE(kick_if_sleeping(&w.need_wakeup, *bell).ok());
    // Pause now and then so that the consumer runs dry and goes to sleep.
    if (next % 64 == 0) std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  EXPECT_EQ(wait_child(child, 120'000), 0);
  uint32_t sleeps = load(w.flag);
  std::printf("[ doorbell ] %llu entries, consumer slept %u times, %llu doorbell writes\n",
              static_cast<unsigned long long>(kTotal), sleeps, static_cast<unsigned long long>(kicks));
  EXPECT_GT(sleeps, 100u) << "the stress must actually exercise the sleep path";
}

}  // namespace
}  // namespace kdn::ipc
