#include <kdn/ipc/segment.h>

#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/falloc.h>
#include <sys/mman.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstring>

#include "testing/fork_child.h"

namespace kdn::ipc {
namespace {

TEST(SharedSegment, CreateRoundsToPagesAndZeroFills) {
  auto seg = SharedSegment::create("seg-test", 5000);
  ASSERT_TRUE(seg.ok()) << seg.status().what();
  EXPECT_EQ(seg->size(), 8192u);
  EXPECT_FALSE(seg->huge_pages());
  for (uint64_t i = 0; i < seg->size(); ++i) ASSERT_EQ(seg->data()[i], std::byte{0});
  EXPECT_FALSE(SharedSegment::create("seg-test", 0).ok());
}

TEST(SharedSegment, SizeIsSealedSoNoHolderCanShrinkIt) {
  auto seg = SharedSegment::create("seg-test", 4096);
  ASSERT_TRUE(seg.ok());
  Result<uint32_t> seals = segment_seals(seg->fd());
  ASSERT_TRUE(seals.ok());
  EXPECT_EQ(*seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL),
            static_cast<uint32_t>(F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL));
  auto dup = seg->dup_fd();
  ASSERT_TRUE(dup.ok());
  EXPECT_NE(::ftruncate(dup->get(), 0), 0) << "a client holding the fd cannot shrink it";
  EXPECT_NE(::ftruncate(dup->get(), 1 << 20), 0);
}

TEST(SharedSegment, UnsealedWhenAsked) {
  SegmentOptions opt;
  opt.seal_size = false;
  auto seg = SharedSegment::create("seg-test", 4096, opt);
  ASSERT_TRUE(seg.ok());
  EXPECT_EQ(*segment_seals(seg->fd()) & F_SEAL_SHRINK, 0u);
}

TEST(SharedSegment, AttachSeesTheSameBytes) {
  auto seg = SharedSegment::create("seg-test", 1 << 16);
  ASSERT_TRUE(seg.ok());
  std::memcpy(seg->data() + 100, "kdn", 4);
  auto fd = seg->dup_fd();
  ASSERT_TRUE(fd.ok());
  auto view = SharedSegment::attach(std::move(*fd), 1 << 16);
  ASSERT_TRUE(view.ok()) << view.status().what();
  EXPECT_STREQ(reinterpret_cast<const char*>(view->data() + 100), "kdn");
  std::memcpy(view->data() + 200, "back", 5);
  EXPECT_STREQ(reinterpret_cast<const char*>(seg->data() + 200), "back");
}

TEST(SharedSegment, AttachRefusesAShortFileInsteadOfFaulting) {
  UniqueFd fd(::memfd_create("short", MFD_CLOEXEC));
  ASSERT_TRUE(fd.valid());
  ASSERT_EQ(::ftruncate(fd.get(), 4096), 0);
  auto seg = SharedSegment::attach(std::move(fd), 1 << 20);
  ASSERT_FALSE(seg.ok());
  EXPECT_EQ(seg.status().code(), Code::kProtocol);
}

TEST(SharedSegment, AttachRefusesNonFilesAndZeroSizes) {
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  ::close(pipe_fds[1]);
  EXPECT_EQ(SharedSegment::attach(UniqueFd(pipe_fds[0]), 4096).status().code(), Code::kProtocol);
  auto seg = SharedSegment::create("seg-test", 4096);
  ASSERT_TRUE(seg.ok());
  EXPECT_EQ(SharedSegment::attach(std::move(*seg->dup_fd()), 0).status().code(), Code::kProtocol);
  EXPECT_EQ(SharedSegment::attach(UniqueFd(), 4096).status().code(), Code::kInvalidArgument);
}

TEST(SharedSegment, ReadOnlyAttach) {
  auto seg = SharedSegment::create("seg-test", 4096);
  ASSERT_TRUE(seg.ok());
  seg->data()[0] = std::byte{7};
  MapOptions ro;
  ro.read_only = true;
  auto view = SharedSegment::attach(std::move(*seg->dup_fd()), 4096, ro);
  ASSERT_TRUE(view.ok());
  EXPECT_EQ(view->data()[0], std::byte{7});
  // A write through a read-only mapping must fault: check it in a child.
  pid_t child = testing::fork_child([&]() -> int {
    std::signal(SIGSEGV, SIG_DFL);  // die quietly, even under a sanitizer's handler
    std::signal(SIGBUS, SIG_DFL);
    view->data()[0] = std::byte{9};
    return 0;
  });
  int rc = testing::wait_child(child, 10'000);
  EXPECT_TRUE(rc == -SIGSEGV || rc == -SIGBUS) << rc;
}

TEST(SharedSegment, HugePagesFallBackWhenUnavailable) {
  SegmentOptions opt;
  opt.huge_pages = true;
  opt.populate = true;
  auto seg = SharedSegment::create("seg-huge", 3 << 20, opt);
  ASSERT_TRUE(seg.ok()) << seg.status().what();
  // Either real 2 MiB pages (rounded to 4 MiB) or the normal-page fallback.
  EXPECT_EQ(seg->size(), seg->huge_pages() ? (4u << 20) : (3u << 20));
  seg->data()[seg->size() - 1] = std::byte{1};
  std::printf("[ segment ] huge pages %s\n", seg->huge_pages() ? "available" : "unavailable: fell back");
}

TEST(SharedSegment, TransparentHugePageAdviceIsHarmless) {
  SegmentOptions opt;
  opt.madvise_huge = true;
  auto seg = SharedSegment::create("seg-thp", 4 << 20, opt);
  ASSERT_TRUE(seg.ok());
  std::memset(seg->data(), 1, seg->size());
  EXPECT_EQ(seg->data()[seg->size() - 1], std::byte{1});
}

// A write-sealed segment (a namespace's arena): only the creator's mapping changes its bytes,
// whatever a holder of the descriptor tries.
TEST(SharedSegment, WriteSealLeavesTheCreatorTheOnlyWriter) {
  SegmentOptions opt;
  opt.seal_writes = true;
  auto seg = SharedSegment::create("seg-sealed", 1 << 20, opt);
  ASSERT_TRUE(seg.ok());
  std::memset(seg->data(), 0x5A, seg->size());  // the creator still writes
  auto seals = segment_seals(seg->fd());
  ASSERT_TRUE(seals.ok());
  EXPECT_NE(*seals & 0x10u /* F_SEAL_FUTURE_WRITE */, 0u);
  // A read-write mapping by anyone else is refused; a read-only one works.
  auto rw = SharedSegment::attach(std::move(*seg->dup_fd()), seg->size());
  EXPECT_FALSE(rw.ok());
  MapOptions ro_opt;
  ro_opt.read_only = true;
  auto ro = SharedSegment::attach(std::move(*seg->dup_fd()), seg->size(), ro_opt);
  ASSERT_TRUE(ro.ok());
  EXPECT_NE(::mprotect(ro->data(), 4096, PROT_READ | PROT_WRITE), 0) << "no upgrade to writable";
  const char junk[8] = {};
  EXPECT_LT(::pwrite(seg->fd(), junk, sizeof junk, 0), 0) << "no write(2)";
  EXPECT_NE(::fallocate(seg->fd(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 4096), 0) << "no hole punching";
  EXPECT_NE(::madvise(ro->data(), 4096, MADV_REMOVE), 0);
  char path[64];
  std::snprintf(path, sizeof path, "/proc/self/fd/%d", seg->fd());
  const int reopened = ::open(path, O_RDWR);
  if (reopened >= 0) {  // the re-opened file carries the same seals
    EXPECT_LT(::pwrite(reopened, junk, sizeof junk, 0), 0);
    ::close(reopened);
  }
  for (size_t i = 0; i < seg->size(); i += 4096) ASSERT_EQ(ro->data()[i], std::byte{0x5A});
}

TEST(SharedSegment, MoveTransfersOwnership) {
  auto seg = SharedSegment::create("seg-test", 4096);
  ASSERT_TRUE(seg.ok());
  std::byte* base = seg->data();
  SharedSegment moved = std::move(*seg);
  EXPECT_EQ(moved.data(), base);
  EXPECT_FALSE(seg->valid());
  SharedSegment other;
  other = std::move(moved);
  EXPECT_EQ(other.data(), base);
  EXPECT_FALSE(moved.valid());
}

}  // namespace
}  // namespace kdn::ipc
