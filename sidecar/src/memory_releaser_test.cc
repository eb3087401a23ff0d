#include "memory_releaser.h"
#include "staging.h"

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <thread>

namespace kdn::sidecar {
namespace {

// Where an object handed over dies: the thread, and when.
struct Witness {
  Witness(std::thread::id* died_on, std::chrono::milliseconds linger) : died_on(died_on), linger(linger) {}
  std::thread::id* died_on;
  std::chrono::milliseconds linger;
  ~Witness() {
    std::this_thread::sleep_for(linger);  // a slow munmap
    *died_on = std::this_thread::get_id();
  }
};

TEST(MemoryReleaser, DropsOffTheCallersThreadWithoutWaitingForIt) {
  std::thread::id died_on;
  MemoryReleaser r;
  auto w = std::make_shared<Witness>(&died_on, std::chrono::milliseconds(300));
  const auto t0 = std::chrono::steady_clock::now();
  r.release(std::move(w));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(100)) << "release() waited for the drop";
  for (int i = 0; i < 200 && r.pending() != 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(r.pending(), 0u);
  EXPECT_NE(died_on, std::thread::id());
  EXPECT_NE(died_on, std::this_thread::get_id());
}

TEST(MemoryReleaser, TheDestructorDropsWhatIsStillQueued) {
  std::thread::id a, b;
  {
    MemoryReleaser r;
    r.release(std::make_shared<Witness>(&a, std::chrono::milliseconds(50)));
    r.release(std::make_shared<Witness>(&b, std::chrono::milliseconds(0)));
  }
  EXPECT_NE(a, std::thread::id());
  EXPECT_NE(b, std::thread::id());
}

TEST(MemoryReleaser, AStagingAreaHandsOverItsMemoryAndIsEmptyAfter) {
  auto area = StagingArea::create(1 << 20);
  ASSERT_TRUE(area.ok());
  ASSERT_TRUE(area->allocate(4096).has_value());
  std::shared_ptr<void> memory = area->take_memory();
  EXPECT_NE(memory, nullptr);
  EXPECT_FALSE(area->valid());
  EXPECT_EQ(area->capacity(), 0u);
  EXPECT_EQ(area->free_bytes(), 0u);
  EXPECT_FALSE(area->allocate(4096).has_value());
  MemoryReleaser r;
  r.release(std::move(memory));
}

}  // namespace
}  // namespace kdn::sidecar
