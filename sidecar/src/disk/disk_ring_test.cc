// DiskRing (disk_ring.h) with a real io_uring on a real temporary file: bytes written and read
// back exactly, payloads in flight capped at the queue depth with metadata beside them, every
// completion seen once, the end of the file, short transfers, retries and errors injected
// through FaultyDiskIo, fixed buffers (whole, outside, across two pieces), O_DIRECT, fdatasync,
// the eventfd wake-up and a destructor that lets requests in flight land.
#include "disk/disk_ring.h"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace kdn::sidecar {
namespace {

constexpr uint64_t kBlock = 4096;
constexpr uint64_t kFileBytes = 4 << 20;

struct FreeDeleter {
  void operator()(std::byte* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<std::byte[], FreeDeleter>;

Buffer aligned(uint64_t bytes) { return Buffer(static_cast<std::byte*>(std::aligned_alloc(kBlock, bytes))); }

// A byte pattern that differs per offset and per seed, so a misplaced block shows.
void fill(std::byte* p, uint64_t bytes, uint64_t seed) {
  for (uint64_t i = 0; i < bytes; ++i) p[i] = std::byte((i * 131 + seed * 7 + (i >> 12)) & 0xff);
}

std::string describe(const Status& st) {
  std::string s = st.what();
  if (st.sys_errno() != 0) s += std::string(": ") + std::strerror(st.sys_errno());
  return s;
}

class DiskRingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kdn-disk-ring-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    fd_ = open_file("slab", 0);
    ASSERT_GE(fd_, 0) << std::strerror(-fd_);
    ASSERT_EQ(ftruncate(fd_, off_t(kFileBytes)), 0);
  }
  void TearDown() override {
    ring_.reset();
    if (fd_ >= 0) close(fd_);
    std::filesystem::remove_all(dir_);
  }

  int open_file(const std::string& name, int extra_flags) {
    return DiskIo::system().openat(AT_FDCWD, dir_ + "/" + name, O_RDWR | O_CREAT | extra_flags, 0600);
  }
  // A ring over fd_; skips the test where the kernel refuses io_uring.
  void make_ring(uint32_t depth, DiskIo& io, int wake_fd = -1) {
    const int files[] = {fd_};
    auto r = DiskRing::create(depth, files, wake_fd, io, 0);
    if (!r.ok()) GTEST_SKIP() << "no io_uring here: " << describe(r.status());
    ring_ = std::move(r).value();
  }
  // Flushes and reaps until `expect` requests finished, recording each one's completions.
  void run(size_t expect) {
    ASSERT_TRUE(ring_->flush().ok());
    size_t finished = 0;
    while (finished < expect) {
      ASSERT_GT(ring_->in_flight() + ring_->queued(), 0u) << "waiting with nothing in flight";
      ASSERT_TRUE(ring_->wait().ok());
      finished += ring_->reap([&](IoRequest* r) { ++seen_[r]; });
      EXPECT_LE(ring_->payloads_in_flight(), ring_->depth());
      ASSERT_TRUE(ring_->flush().ok());
    }
    EXPECT_EQ(finished, expect);
  }
  static IoRequest request(IoKind kind, std::byte* buf, uint64_t offset, uint64_t bytes) {
    IoRequest r;
    r.kind = kind;
    r.buf = buf;
    r.offset = offset;
    r.bytes = bytes;
    return r;
  }
  // The file's bytes as the kernel has them, read without the ring.
  std::vector<std::byte> file_bytes(uint64_t offset, uint64_t bytes) const {
    std::vector<std::byte> out(bytes);
    EXPECT_EQ(pread(fd_, out.data(), bytes, off_t(offset)), ssize_t(bytes));
    return out;
  }

  std::string dir_;
  int fd_ = -1;
  std::unique_ptr<DiskRing> ring_;
  std::map<IoRequest*, int> seen_;  // completions per request
};

TEST_F(DiskRingTest, WritesAndReadsLandByteForByte) {
  make_ring(8, DiskIo::system());
  constexpr int kN = 12;
  constexpr uint64_t kBytes = 64 << 10;
  Buffer out = aligned(kN * kBytes), in = aligned(kN * kBytes);
  std::vector<IoRequest> w, rd;
  for (int i = 0; i < kN; ++i) {
    fill(out.get() + i * kBytes, kBytes, uint64_t(i) + 1);
    // Every other block of the file, in reverse order: offsets must be honoured.
    w.push_back(request(IoKind::kWrite, out.get() + i * kBytes, uint64_t(kN - 1 - i) * 2 * kBytes, kBytes));
  }
  for (IoRequest& r : w) ring_->submit(&r);
  run(kN);
  for (int i = 0; i < kN; ++i) {
    EXPECT_EQ(w[i].result, 0);
    EXPECT_EQ(w[i].done, kBytes);
    const auto on_disk = file_bytes(w[i].offset, kBytes);
    EXPECT_EQ(std::memcmp(on_disk.data(), out.get() + i * kBytes, kBytes), 0) << "write " << i;
  }
  std::memset(in.get(), 0, kN * kBytes);
  for (int i = 0; i < kN; ++i) rd.push_back(request(IoKind::kRead, in.get() + i * kBytes, w[i].offset, kBytes));
  for (IoRequest& r : rd) ring_->submit(&r);
  run(kN);
  for (int i = 0; i < kN; ++i) EXPECT_EQ(rd[i].result, 0);
  EXPECT_EQ(std::memcmp(in.get(), out.get(), kN * kBytes), 0);
  EXPECT_EQ(ring_->counters().short_transfers, 0u);
}

TEST_F(DiskRingTest, PayloadsInFlightAreCappedAndEveryCompletionIsSeenOnce) {
  make_ring(4, DiskIo::system());
  constexpr int kN = 40;
  constexpr uint64_t kBytes = 16 << 10;
  Buffer buf = aligned(kN * kBytes);
  std::vector<IoRequest> reqs;
  for (int i = 0; i < kN; ++i) {
    fill(buf.get() + i * kBytes, kBytes, uint64_t(i));
    reqs.push_back(request(IoKind::kWrite, buf.get() + i * kBytes, uint64_t(i) * kBytes, kBytes));
    reqs.back().owner = uint64_t(i);
  }
  for (IoRequest& r : reqs) ring_->submit(&r);
  EXPECT_EQ(ring_->payloads_in_flight(), 4u);
  EXPECT_EQ(ring_->queued(), size_t(kN - 4));
  EXPECT_EQ(ring_->counters().queued_max, uint64_t(kN - 4));
  run(kN);
  ASSERT_EQ(seen_.size(), size_t(kN));
  for (const IoRequest& r : reqs) {
    EXPECT_EQ(seen_[const_cast<IoRequest*>(&r)], 1) << "request " << r.owner;
    EXPECT_EQ(r.result, 0);
  }
  EXPECT_EQ(ring_->in_flight(), 0u);
  EXPECT_EQ(ring_->queued(), 0u);
  EXPECT_EQ(ring_->counters().submitted, uint64_t(kN));
  EXPECT_EQ(ring_->counters().completed, uint64_t(kN));
  const auto on_disk = file_bytes(0, kN * kBytes);
  EXPECT_EQ(std::memcmp(on_disk.data(), buf.get(), kN * kBytes), 0);
}

TEST_F(DiskRingTest, MetadataWritesHaveTheirOwnCap) {
  make_ring(2, DiskIo::system());
  Buffer buf = aligned(2 * (64 << 10) + 3 * kBlock);
  std::byte* meta = buf.get() + 2 * (64 << 10);
  std::vector<IoRequest> reqs;
  reqs.push_back(request(IoKind::kWrite, buf.get(), 0, 64 << 10));
  reqs.push_back(request(IoKind::kWrite, buf.get() + (64 << 10), 64 << 10, 64 << 10));
  for (int i = 0; i < 3; ++i)
    reqs.push_back(request(IoKind::kWrite, meta + i * kBlock, (1 << 20) + i * kBlock, kBlock));
  fill(buf.get(), 2 * (64 << 10) + 3 * kBlock, 5);
  for (IoRequest& r : reqs) ring_->submit(&r);
  // Two payloads and two headers go out; the third header waits behind the metadata cap only.
  EXPECT_EQ(ring_->payloads_in_flight(), 2u);
  EXPECT_EQ(ring_->in_flight(), 4u);
  EXPECT_EQ(ring_->queued(), 1u);
  IoRequest sync;
  sync.kind = IoKind::kSync;
  ring_->submit(&sync);
  EXPECT_EQ(ring_->queued(), 2u);
  run(reqs.size() + 1);
  for (const IoRequest& r : reqs) EXPECT_EQ(r.result, 0);
  EXPECT_EQ(sync.result, 0);
  const auto on_disk = file_bytes(1 << 20, 3 * kBlock);
  EXPECT_EQ(std::memcmp(on_disk.data(), meta, 3 * kBlock), 0);
}

TEST_F(DiskRingTest, ReadingAtOrAcrossTheEndOfTheFile) {
  make_ring(4, DiskIo::system());
  Buffer buf = aligned(2 * kBlock);
  IoRequest at_end = request(IoKind::kRead, buf.get(), kFileBytes, kBlock);
  ring_->submit(&at_end);
  run(1);
  EXPECT_EQ(at_end.result, -ENODATA);
  // Half of it lies in the file: that half arrives, then the end of the file stops it.
  IoRequest across = request(IoKind::kRead, buf.get(), kFileBytes - kBlock, 2 * kBlock);
  ring_->submit(&across);
  run(1);
  EXPECT_EQ(across.result, -ENODATA);
  EXPECT_EQ(across.done, kBlock);
  EXPECT_EQ(across.short_count, 1u);
  EXPECT_EQ(seen_[&across], 1);
}

TEST_F(DiskRingTest, InjectedShortTransfersContinueWhereTheyStopped) {
  FaultyDiskIo io;
  make_ring(4, io);
  constexpr uint64_t kBytes = 256 << 10;
  Buffer out = aligned(kBytes), in = aligned(kBytes);
  fill(out.get(), kBytes, 9);
  io.fail_next(IoKind::kWrite, int32_t(3 * kBlock), 1);
  io.fail_next(IoKind::kWrite, int32_t(kBlock), 1);
  IoRequest w = request(IoKind::kWrite, out.get(), 8 * kBlock, kBytes);
  ring_->submit(&w);
  run(1);
  EXPECT_EQ(w.result, 0);
  EXPECT_EQ(w.short_count, 2u);
  EXPECT_EQ(io.pending(), 0u);
  const auto on_disk = file_bytes(8 * kBlock, kBytes);
  EXPECT_EQ(std::memcmp(on_disk.data(), out.get(), kBytes), 0);

  std::memset(in.get(), 0, kBytes);
  io.fail_next(IoKind::kRead, int32_t(5 * kBlock), 1);
  IoRequest rd = request(IoKind::kRead, in.get(), 8 * kBlock, kBytes);
  ring_->submit(&rd);
  run(1);
  EXPECT_EQ(rd.result, 0);
  EXPECT_EQ(rd.short_count, 1u);
  EXPECT_EQ(std::memcmp(in.get(), out.get(), kBytes), 0);
  EXPECT_EQ(ring_->counters().short_transfers, 3u);
  EXPECT_EQ(seen_.size(), 2u);
}

TEST_F(DiskRingTest, AgainAndInterruptedAreResubmitted) {
  FaultyDiskIo io;
  make_ring(4, io);
  constexpr uint64_t kBytes = 32 << 10;
  Buffer out = aligned(kBytes), in = aligned(kBytes);
  fill(out.get(), kBytes, 3);
  io.fail_next(IoKind::kWrite, -EAGAIN, 3);
  io.fail_next(IoKind::kWrite, -EINTR, 1);
  IoRequest w = request(IoKind::kWrite, out.get(), 0, kBytes);
  ring_->submit(&w);
  run(1);
  EXPECT_EQ(w.result, 0);
  EXPECT_EQ(w.retries, 4u);
  EXPECT_EQ(ring_->counters().retries, 4u);
  IoRequest rd = request(IoKind::kRead, in.get(), 0, kBytes);
  io.fail_next(IoKind::kRead, -EAGAIN, 2);
  ring_->submit(&rd);
  run(1);
  EXPECT_EQ(rd.result, 0);
  EXPECT_EQ(rd.retries, 2u);
  EXPECT_EQ(std::memcmp(in.get(), out.get(), kBytes), 0);
  EXPECT_EQ(seen_[&w], 1);
  EXPECT_EQ(seen_[&rd], 1);
}

TEST_F(DiskRingTest, InjectedErrorsEndTheRequestOnce) {
  FaultyDiskIo io;
  make_ring(4, io);
  constexpr uint64_t kBytes = 64 << 10;
  Buffer buf = aligned(4 * kBytes);
  fill(buf.get(), 4 * kBytes, 1);
  // min_bytes: only the 64 KiB transfers, so the header and the 32 KiB write are untouched.
  io.fail_next(IoKind::kRead, -EIO, 1, uint32_t(kBytes));
  io.fail_next(IoKind::kWrite, -ENOSPC, 1, uint32_t(kBytes));
  IoRequest rd = request(IoKind::kRead, buf.get(), 0, kBytes);
  IoRequest w = request(IoKind::kWrite, buf.get() + kBytes, kBytes, kBytes);
  IoRequest header = request(IoKind::kWrite, buf.get() + 2 * kBytes, 2 * kBytes, kBlock);
  IoRequest ok = request(IoKind::kWrite, buf.get() + 3 * kBytes, 3 * kBytes, kBytes / 2);
  for (IoRequest* r : {&rd, &header, &w, &ok}) ring_->submit(r);
  run(4);
  EXPECT_EQ(rd.result, -EIO);
  EXPECT_EQ(w.result, -ENOSPC);
  EXPECT_EQ(header.result, 0);
  EXPECT_EQ(ok.result, 0);
  EXPECT_EQ(io.injected(), 2u);
  for (IoRequest* r : {&rd, &header, &w, &ok}) EXPECT_EQ(seen_[r], 1);
}

TEST_F(DiskRingTest, AWriteThatMovesNothingIsAnIoError) {
  FaultyDiskIo io;
  make_ring(4, io);
  Buffer buf = aligned(16 << 10);
  io.fail_next(IoKind::kWrite, 0, 1);
  IoRequest w = request(IoKind::kWrite, buf.get(), 0, 16 << 10);
  ring_->submit(&w);
  run(1);
  EXPECT_EQ(w.result, -EIO);
}

TEST_F(DiskRingTest, FixedBuffersInsideOutsideAndAcrossPieces) {
  make_ring(4, DiskIo::system());
  constexpr uint64_t kPiece = 64 << 10;
  Buffer reg = aligned(2 * kPiece), other = aligned(kPiece), back = aligned(2 * kPiece);
  const iovec pieces[] = {{reg.get(), kPiece}, {reg.get() + kPiece, kPiece}};
  const Status st = ring_->register_buffers(pieces);
  if (!st.ok()) GTEST_SKIP() << "buffer registration refused here: " << describe(st);
  ASSERT_TRUE(ring_->buffers_registered());
  fill(reg.get(), 2 * kPiece, 11);
  fill(other.get(), kPiece, 12);
  IoRequest inside = request(IoKind::kWrite, reg.get(), 0, kPiece);
  IoRequest outside = request(IoKind::kWrite, other.get(), 4 * kPiece, kPiece);
  ring_->submit(&inside);
  ring_->submit(&outside);
  run(2);
  EXPECT_EQ(ring_->counters().fixed, 1u);
  EXPECT_EQ(ring_->counters().unfixed, 1u);
  // Half in each piece: two parts, each a fixed transfer.
  IoRequest across = request(IoKind::kWrite, reg.get() + kPiece / 2, kPiece, kPiece);
  ring_->submit(&across);
  run(1);
  EXPECT_EQ(across.result, 0);
  EXPECT_EQ(ring_->counters().fixed, 3u);
  EXPECT_EQ(ring_->counters().short_transfers, 0u);
  EXPECT_EQ(seen_[&across], 1);
  IoRequest rd = request(IoKind::kRead, back.get(), 0, 2 * kPiece);  // into unregistered memory
  ring_->submit(&rd);
  run(1);
  EXPECT_EQ(std::memcmp(back.get(), reg.get(), kPiece), 0);
  EXPECT_EQ(std::memcmp(back.get() + kPiece, reg.get() + kPiece / 2, kPiece), 0);
  EXPECT_EQ(file_bytes(4 * kPiece, kPiece), std::vector<std::byte>(other.get(), other.get() + kPiece));
}

TEST_F(DiskRingTest, APieceOverOneGibIsRefusedAndTheRingStaysUsable) {
  make_ring(2, DiskIo::system());
  const iovec huge[] = {{nullptr, (1ull << 30) + 1}};
  const Status st = ring_->register_buffers(huge);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_FALSE(ring_->buffers_registered());
  Buffer buf = aligned(8 << 10);
  fill(buf.get(), 8 << 10, 2);
  IoRequest w = request(IoKind::kWrite, buf.get(), 0, 8 << 10);
  ring_->submit(&w);
  run(1);
  EXPECT_EQ(w.result, 0);
  EXPECT_EQ(ring_->counters().unfixed, 1u);
}

TEST_F(DiskRingTest, DirectIoRoundTrip) {
  const int direct = open_file("direct", O_DIRECT);
  if (direct == -EINVAL) GTEST_SKIP() << "the file system under " << dir_ << " refuses O_DIRECT";
  ASSERT_GE(direct, 0) << std::strerror(-direct);
  ASSERT_EQ(ftruncate(direct, 1 << 20), 0);
  const int files[] = {fd_, direct};
  auto r = DiskRing::create(4, files, -1, DiskIo::system(), 0);
  if (!r.ok()) {
    close(direct);
    GTEST_SKIP() << "no io_uring here: " << describe(r.status());
  }
  ring_ = std::move(r).value();
  constexpr uint64_t kBytes = 128 << 10;
  Buffer out = aligned(kBytes), in = aligned(kBytes);
  fill(out.get(), kBytes, 21);
  std::memset(in.get(), 0, kBytes);
  IoRequest w = request(IoKind::kWrite, out.get(), 3 * kBlock, kBytes);
  w.file = 1;
  ring_->submit(&w);
  run(1);
  ASSERT_EQ(w.result, 0) << std::strerror(-w.result);
  IoRequest rd = request(IoKind::kRead, in.get(), 3 * kBlock, kBytes);
  rd.file = 1;
  ring_->submit(&rd);
  run(1);
  EXPECT_EQ(rd.result, 0);
  EXPECT_EQ(std::memcmp(in.get(), out.get(), kBytes), 0);
  ring_.reset();
  close(direct);
}

TEST_F(DiskRingTest, CompletionsSignalTheEventfd) {
  const int efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  ASSERT_GE(efd, 0);
  make_ring(2, DiskIo::system(), efd);
  uint64_t count = 0;
  EXPECT_EQ(read(efd, &count, sizeof count), -1) << "nothing signalled before any request";
  Buffer buf = aligned(8 << 10);
  IoRequest rd = request(IoKind::kRead, buf.get(), 0, 8 << 10);
  ring_->submit(&rd);
  run(1);
  EXPECT_EQ(read(efd, &count, sizeof count), ssize_t(sizeof count));
  EXPECT_GE(count, 1u);
  ring_.reset();
  close(efd);
}

TEST_F(DiskRingTest, DestroyingTheRingLetsRequestsInFlightLand) {
  make_ring(2, DiskIo::system());
  constexpr uint64_t kBytes = 64 << 10;
  Buffer buf = aligned(2 * kBytes);
  fill(buf.get(), 2 * kBytes, 33);
  IoRequest a = request(IoKind::kWrite, buf.get(), 0, kBytes);
  IoRequest b = request(IoKind::kWrite, buf.get() + kBytes, kBytes, kBytes);
  ring_->submit(&a);
  ring_->submit(&b);
  ASSERT_TRUE(ring_->flush().ok());
  ring_.reset();  // must wait for both writes before returning
  const auto on_disk = file_bytes(0, 2 * kBytes);
  EXPECT_EQ(std::memcmp(on_disk.data(), buf.get(), 2 * kBytes), 0);
}

TEST(DiskRing, QueueDepthIsBounded) {
  for (uint32_t depth : {0u, 4097u}) {
    auto r = DiskRing::create(depth, {}, -1, DiskIo::system(), 0);
    ASSERT_FALSE(r.ok()) << depth;
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  }
}

}  // namespace
}  // namespace kdn::sidecar
