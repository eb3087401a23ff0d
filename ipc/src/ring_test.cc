#include <kdn/common/clock.h>
#include <kdn/ipc/ring.h>
#include <kdn/ipc/segment.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <random>
#include <vector>

#include "testing/fork_child.h"

namespace kdn::ipc {
namespace {

using testing::fork_child;
using testing::wait_child;

// 64 bytes whose content is a function of its sequence number, so a torn, reordered,
// duplicated or skipped entry is detected.
struct TestEntry {
  uint64_t seq;
  uint64_t words[7];
};
static_assert(sizeof(TestEntry) == 64);

uint64_t mix(uint64_t seq, int i) { return (seq + 1) * 0x9E3779B97F4A7C15ull ^ (static_cast<uint64_t>(i) << 56); }

TestEntry make_entry(uint64_t seq) {
  TestEntry e;
  e.seq = seq;
  for (int i = 0; i < 7; ++i) e.words[i] = mix(seq, i);
  return e;
}

bool entry_ok(const TestEntry& e, uint64_t seq) {
  if (e.seq != seq) return false;
  for (int i = 0; i < 7; ++i) {
    if (e.words[i] != mix(seq, i)) return false;
  }
  return true;
}

class RingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Result<SharedSegment> seg = SharedSegment::create("ring-test", ring_region_bytes(kCap, sizeof(TestEntry)));
    ASSERT_TRUE(seg.ok()) << seg.status().what();
    segment_ = std::move(*seg);
  }
  RingHeader* header() { return reinterpret_cast<RingHeader*>(segment_.data()); }
  Result<RingProducer<TestEntry>> producer(uint32_t start = 0) {
    return RingProducer<TestEntry>::attach(segment_.data(), segment_.size(), kCap, start);
  }
  Result<RingConsumer<TestEntry>> consumer(uint32_t start = 0) {
    return RingConsumer<TestEntry>::attach(segment_.data(), segment_.size(), kCap, start);
  }

  static constexpr uint32_t kCap = 64;
  SharedSegment segment_;
};

TEST_F(RingTest, AttachRejectsBadGeometry) {
  EXPECT_FALSE(RingProducer<TestEntry>::attach(segment_.data(), segment_.size(), 48).ok());
  EXPECT_FALSE(RingProducer<TestEntry>::attach(segment_.data(), segment_.size(), 0).ok());
  EXPECT_FALSE(RingProducer<TestEntry>::attach(segment_.data(), 128 + 63 * 64, 64).ok());
  EXPECT_FALSE(RingConsumer<TestEntry>::attach(segment_.data() + 8, segment_.size() - 8, 32).ok());
  EXPECT_FALSE(RingConsumer<TestEntry>::attach(nullptr, 1 << 20, 64).ok());
}

TEST_F(RingTest, FullAndEmpty) {
  auto p = producer();
  auto c = consumer();
  ASSERT_TRUE(p.ok() && c.ok());
  TestEntry out;
  Result<bool> popped = c->try_pop(out);
  ASSERT_TRUE(popped.ok());
  EXPECT_FALSE(*popped) << "a fresh ring is empty";
  for (uint32_t i = 0; i < kCap; ++i) {
    Result<bool> pushed = p->try_push(make_entry(i));
    ASSERT_TRUE(pushed.ok() && *pushed) << i;
  }
  Result<bool> extra = p->try_push(make_entry(kCap));
  ASSERT_TRUE(extra.ok());
  EXPECT_FALSE(*extra) << "a full ring refuses a push";
  EXPECT_EQ(*p->free_slots(), 0u);
  EXPECT_EQ(*c->available(), kCap);
  for (uint32_t i = 0; i < kCap; ++i) {
    ASSERT_TRUE(*c->try_pop(out));
    EXPECT_TRUE(entry_ok(out, i));
  }
  EXPECT_FALSE(*c->try_pop(out)) << "drained ring is empty again";
  EXPECT_EQ(*p->free_slots(), kCap);
}

TEST_F(RingTest, BatchesWrapAroundTheU32Counters) {
  // Start a few entries before 2^32 so the free-running indices wrap during the test.
  const uint32_t start = 0xFFFFFFFFu - 100;
  header()->head = start;
  header()->tail = start;
  auto p = producer(start);
  auto c = consumer(start);
  ASSERT_TRUE(p.ok() && c.ok());
  std::vector<TestEntry> in(kCap + 10), out(kCap);
  uint64_t next_in = 0, next_out = 0;
  while (next_out < 1000) {
    for (size_t i = 0; i < in.size(); ++i) in[i] = make_entry(next_in + i);
    Result<uint32_t> pushed = p->try_push_n(in);
    ASSERT_TRUE(pushed.ok());
    next_in += *pushed;
    Result<uint32_t> popped = c->try_pop_n(std::span(out).first(13));
    ASSERT_TRUE(popped.ok());
    for (uint32_t i = 0; i < *popped; ++i) ASSERT_TRUE(entry_ok(out[i], next_out + i));
    next_out += *popped;
  }
  EXPECT_LT(p->published(), start) << "the tail wrapped past 2^32";
}

TEST_F(RingTest, ConsumerRejectsImpossibleTail) {
  auto p = producer();
  auto c = consumer();
  ASSERT_TRUE(p.ok() && c.ok());
  header()->tail = kCap + 1;  // more entries than the ring holds
  TestEntry out;
  Result<bool> r = c->try_pop(out);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kProtocol);
  EXPECT_TRUE(c->broken());
  header()->tail = 1;  // even a sane value later does not revive it
  EXPECT_FALSE(c->try_pop(out).ok());
}

TEST_F(RingTest, ConsumerRejectsTailMovingBackwards) {
  auto p = producer();
  auto c = consumer();
  ASSERT_TRUE(p.ok() && c.ok());
  for (uint32_t i = 0; i < 5; ++i) ASSERT_TRUE(*p->try_push(make_entry(i)));
  TestEntry out;
  for (uint32_t i = 0; i < 5; ++i) ASSERT_TRUE(*c->try_pop(out));
  header()->tail = 3;  // the producer "unpublishes" entries we already consumed
  Result<bool> r = c->try_pop(out);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kProtocol);
}

TEST_F(RingTest, ProducerRejectsImpossibleHead) {
  auto p = producer();
  ASSERT_TRUE(p.ok());
  for (uint32_t i = 0; i < kCap; ++i) ASSERT_TRUE(*p->try_push(make_entry(i)));
  header()->head = kCap + 7;  // consumed more than was published
  Result<bool> r = p->try_push(make_entry(0));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kProtocol);
  EXPECT_FALSE(p->free_slots().ok());
}

TEST_F(RingTest, ProducerRejectsHeadMovingBackwards) {
  auto p = producer();
  auto c = consumer();
  ASSERT_TRUE(p.ok() && c.ok());
  for (uint32_t i = 0; i < kCap; ++i) ASSERT_TRUE(*p->try_push(make_entry(i)));
  TestEntry out;
  for (uint32_t i = 0; i < 10; ++i) ASSERT_TRUE(*c->try_pop(out));
  ASSERT_EQ(*p->free_slots(), 10u);
  header()->head = 4;
  EXPECT_EQ(p->free_slots().status().code(), Code::kProtocol);
}

TEST_F(RingTest, RandomGarbageNeverEscapesTheRegion) {
  // Whatever the peer writes, each call returns promptly and either works or reports
  // KDN_ERR_PROTOCOL; entries are only ever read from inside the region (ASan would see).
  std::mt19937 rng(7);
  for (int round = 0; round < 2000; ++round) {
    header()->head = 0;
    header()->tail = 0;
    auto p = producer();
    auto c = consumer();
    ASSERT_TRUE(p.ok() && c.ok());
    header()->tail = rng();
    header()->head = rng();
    TestEntry out;
    std::vector<TestEntry> many(kCap);
    Result<uint32_t> n = c->try_pop_n(many);
    if (n.ok()) {
      EXPECT_LE(*n, kCap);
    }
    Result<bool> pushed = p->try_push(out);
    (void)pushed;
    (void)c->try_pop(out);
  }
}

// One process produces, the other consumes, through a shared memfd mapping.
void run_cross_process(SharedSegment& segment, uint32_t cap, uint64_t total, bool child_produces) {
  auto produce = [&]() -> int {
    auto p = RingProducer<TestEntry>::attach(segment.data(), segment.size(), cap);
    if (!p.ok()) return 2;
    std::vector<TestEntry> batch(32);
    uint64_t next = 0;
    while (next < total) {
      size_t n = std::min<uint64_t>(batch.size(), total - next);
      for (size_t i = 0; i < n; ++i) batch[i] = make_entry(next + i);
      Result<uint32_t> pushed = p->try_push_n(std::span(batch).first(n));
      if (!pushed.ok()) return 3;
      next += *pushed;
      if (*pushed == 0) cpu_relax();
    }
    return 0;
  };
  auto consume = [&]() -> int {
    auto c = RingConsumer<TestEntry>::attach(segment.data(), segment.size(), cap);
    if (!c.ok()) return 2;
    std::vector<TestEntry> batch(32);
    uint64_t next = 0;
    while (next < total) {
      Result<uint32_t> popped = c->try_pop_n(batch);
      if (!popped.ok()) return 3;
      for (uint32_t i = 0; i < *popped; ++i) {
        if (!entry_ok(batch[i], next + i)) return 4;
      }
      next += *popped;
      if (*popped == 0) cpu_relax();
    }
    return 0;
  };
  uint64_t start = now_ns();
  pid_t child = fork_child(child_produces ? std::function<int()>(produce) : std::function<int()>(consume));
  ASSERT_GT(child, 0);
  int parent_rc = child_produces ? consume() : produce();
  int child_rc = wait_child(child, 120'000);
  double secs = static_cast<double>(now_ns() - start) / 1e9;
  EXPECT_EQ(parent_rc, 0);
  EXPECT_EQ(child_rc, 0);
  std::printf("[ ring ] %llu entries of 64 B across processes in %.3f s: %.1f M entries/s\n",
              static_cast<unsigned long long>(total), secs, static_cast<double>(total) / secs / 1e6);
}

TEST(RingCrossProcess, MillionsOfEntriesInOrderParentProduces) {
  constexpr uint32_t kCap = 1024;
  auto seg = SharedSegment::create("ring-xp", ring_region_bytes(kCap, sizeof(TestEntry)));
  ASSERT_TRUE(seg.ok());
  run_cross_process(*seg, kCap, 4'000'000, false);
}

TEST(RingCrossProcess, MillionsOfEntriesInOrderChildProduces) {
  constexpr uint32_t kCap = 16;  // tiny ring: the full and empty paths are hit constantly
  auto seg = SharedSegment::create("ring-xp", ring_region_bytes(kCap, sizeof(TestEntry)));
  ASSERT_TRUE(seg.ok());
  run_cross_process(*seg, kCap, 2'000'000, true);
}

TEST(RingCrossProcess, HostilePeerScribblingIndicesCannotHangOrCrashUs) {
  constexpr uint32_t kCap = 64;
  const uint64_t ring_bytes = ring_region_bytes(kCap, sizeof(TestEntry));
  auto seg = SharedSegment::create("ring-hostile", ring_bytes + 128);
  ASSERT_TRUE(seg.ok());
  auto* header = reinterpret_cast<RingHeader*>(seg->data());
  // A word after the ring tells the scribbler to stop.
  std::atomic_ref<uint32_t> stop_word(*reinterpret_cast<uint32_t*>(seg->data() + ring_bytes));
  std::atomic_ref<uint32_t> started_word(*reinterpret_cast<uint32_t*>(seg->data() + ring_bytes + 64));
  pid_t child = fork_child([&]() -> int {
    std::mt19937 rng(1234);
    started_word.store(1, std::memory_order_relaxed);
    while (stop_word.load(std::memory_order_relaxed) == 0) {
      std::atomic_ref<uint32_t>(header->head).store(rng(), std::memory_order_relaxed);
      std::atomic_ref<uint32_t>(header->tail).store(rng(), std::memory_order_relaxed);
    }
    return 0;
  });
  ASSERT_GT(child, 0);
  uint64_t give_up = now_ns() + 10'000'000'000ull;
  while (started_word.load(std::memory_order_relaxed) == 0 && now_ns() < give_up) cpu_relax();
  int producer_errors = 0, consumer_errors = 0;
  // A thousand rounds take a few ms; on a loaded machine the scribbler may not run during them,
  // so the rounds go on (up to 10 s) until it has been seen on both sides.
  give_up = now_ns() + 10'000'000'000ull;
  for (int round = 0; round < 1000 || ((producer_errors == 0 || consumer_errors == 0) && now_ns() < give_up);
       ++round) {
    auto p = RingProducer<TestEntry>::attach(seg->data(), seg->size(), kCap);
    auto c = RingConsumer<TestEntry>::attach(seg->data(), seg->size(), kCap);
    ASSERT_TRUE(p.ok() && c.ok());
    TestEntry e = make_entry(round);
    for (int i = 0; i < 100 && !p->broken(); ++i) producer_errors += p->try_push(e).ok() ? 0 : 1;
    for (int i = 0; i < 100 && !c->broken(); ++i) consumer_errors += c->try_pop(e).ok() ? 0 : 1;
  }
  stop_word.store(1, std::memory_order_relaxed);
  EXPECT_EQ(wait_child(child, 10'000), 0);
  EXPECT_GT(producer_errors, 0) << "garbage heads must be detected";
  EXPECT_GT(consumer_errors, 0) << "garbage tails must be detected";
}

}  // namespace
}  // namespace kdn::ipc
