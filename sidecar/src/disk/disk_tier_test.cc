// T2 against real slab files in a temporary directory: the format's encoders and decoders,
// round trips through every codec, recovery after a reopen, the background re-encoding pass,
// and every fault the I/O seam (FaultyDiskIo) injects or a test does to the files themselves.
// Nothing here may ever hand back a byte that differs from what was written (lossy codecs:
// within their error bound), whatever the fault.
#include "disk/disk_tier_internal.h"

#include <kdn/common/clock.h>
#include <kdn/common/model_presets.h>
#include <kdn/kernels/synthetic.h>

#include <gtest/gtest.h>
#include <kdn/common/testing/require.h>

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <random>

namespace kdn::sidecar {
namespace {

using disk::DiskCodec;
using disk::kBlock;

constexpr uint64_t kMiB = 1ull << 20;

kdn_model_desc test_model() { return shaped_desc(2, 2, 64, 256, "disk-test"); }

kdn_key K(uint64_t i) { return kdn_key{i * 0x9E3779B97F4A7C15ull + 1, i}; }

// ---- the format ----------------------------------------------------------------------------------

TEST(DiskFormat, StructuresRoundTripAndRefuseDamage) {
  AlignedBuffer b(kBlock);
  disk::SlotHeader h;
  for (int i = 0; i < 16; ++i) h.file_id[i] = uint8_t(i * 7);
  h.slot_offset = 40960;
  h.slot_bytes = 5 * kBlock;
  h.key = K(3);
  h.fingerprint = K(99);
  h.sequence = 12345;
  h.raw_bytes = 16000;
  h.stored_bytes = 9000;
  h.codec = DiskCodec::kLossless;
  h.payload_crc = 0xDEADBEEF;
  h.raw_hash = K(7);
  h.name_space = "team-a";
  disk::encode_slot_header(h, b.data());
  disk::SlotHeader back;
  ASSERT_TRUE(disk::decode_slot_header(b.data(), &back).ok());
  EXPECT_EQ(back.key, h.key);
  EXPECT_EQ(back.sequence, h.sequence);
  EXPECT_EQ(back.codec, DiskCodec::kLossless);
  EXPECT_EQ(back.name_space, "team-a");
  // Every single flipped byte is refused (the CRC covers the whole block).
  for (uint64_t i = 0; i < kBlock; ++i) {
    b.data()[i] ^= std::byte{0x40};
    EXPECT_FALSE(disk::decode_slot_header(b.data(), &back).ok()) << "byte " << i;
    b.data()[i] ^= std::byte{0x40};
  }
  // A well-sealed header with impossible sizes is refused too.
  h.stored_bytes = h.slot_bytes;
  disk::encode_slot_header(h, b.data());
  EXPECT_EQ(disk::decode_slot_header(b.data(), &back).code(), Code::kCorrupt);

  disk::Superblock s;
  s.name_space = "default";
  s.layout = disk::FileLayout::for_data_bytes(300 * kMiB, 64 * kMiB);
  EXPECT_EQ(s.layout.slab_count, 4u);
  EXPECT_EQ(s.layout.data_offset, 2 * kBlock);
  disk::encode_superblock(s, b.data());
  disk::Superblock sb;
  ASSERT_TRUE(disk::decode_superblock(b.data(), &sb).ok());
  EXPECT_EQ(sb.layout.file_bytes, s.layout.file_bytes);
  b.data()[100] ^= std::byte{1};
  EXPECT_FALSE(disk::decode_superblock(b.data(), &sb).ok());

  std::byte e[disk::kSlabEntryBytes] = {};
  disk::SlabEntry entry;
  EXPECT_FALSE(disk::decode_slab_entry(e, &entry)) << "zeros are an unassigned slab";
  disk::encode_slab_entry({3 * kBlock, true}, e);
  ASSERT_TRUE(disk::decode_slab_entry(e, &entry));
  EXPECT_EQ(entry.slot_bytes, 3 * kBlock);
  EXPECT_TRUE(entry.continuation);

  EXPECT_EQ(disk::slot_bytes_for(1, false), 2 * kBlock);
  EXPECT_EQ(disk::slot_bytes_for(5 * kBlock, false), 6 * kBlock);
  // Coarse sizes: at most 8 per power of two, never smaller than asked.
  std::set<uint64_t> classes;
  for (uint64_t v = 1 << 20; v < 2 << 20; v += 4096) {
    const uint64_t c = disk::slot_bytes_for(v, true);
    EXPECT_GE(c, v + kBlock);
    classes.insert(c);
  }
  EXPECT_LE(classes.size(), 9u);
}

// ---- the tier ------------------------------------------------------------------------------------

class DiskTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kdn-disk-test-XXXXXX";
    root_ = mkdtemp(tmpl);
    dirs_ = {root_ + "/d0", root_ + "/d1"};
    for (auto& d : dirs_) ::mkdir(d.c_str(), 0700);
    auto m = ModelInfo::from_desc(test_model());
    ASSERT_TRUE(m.ok());
    model_ = *m;
    arena_ = AlignedBuffer(64 * kMiB);
    ASSERT_NE(arena_.data(), nullptr);
    options_.dirs = dirs_;
    options_.name_space = "test";
    options_.bytes_per_dir = 32 * kMiB;
    options_.slab_bytes = 4 * kMiB;
    options_.queue_depth = 8;
    options_.workers = 2;
    options_.arena = std::span(arena_.data(), arena_.size());
  }
  void TearDown() override {
    tier_.reset();
    std::filesystem::remove_all(root_);
  }

  // (Re)opens the tier; recovered chunks land in recovered_.
  Status open(DiskIo* io = nullptr) {
    tier_.reset();
    recovered_.clear();
    auto t = DiskTier::open(options_, io ? *io : io_, &recovered_, &report_);
    if (!t.ok()) return t.status();
    tier_ = std::move(t.value());
    tier_->learn_model(model_);
    return OkStatus();
  }

  // Arena slot i (chunk-sized, block-aligned).
  std::byte* slot(uint32_t i) { return arena_.data() + uint64_t(i) * model_.chunk_bytes; }

  void fill(uint32_t i, uint64_t seed) {
    kernels::SyntheticKvParams p;
    p.seed = seed;
    ASSERT_TRUE(kernels::fill_synthetic_kv(slot(i), kernels::kvc1_geometry(model_), p).ok());
  }

  // Runs the tier until `n` completions arrived (waiting on its wake fd); returns them. The
  // bound catches a lost completion, not a slow one: a shared CI disk can take seconds per
  // direct write while other tests flush theirs.
  std::vector<TierCompletion> wait_for(size_t n, uint64_t timeout_ms = 60000) {
    std::vector<TierCompletion> got;
    const uint64_t deadline = now_ns() + timeout_ms * 1'000'000;
    while (got.size() < n && now_ns() < deadline) {
      TierCompletion c[16];
      const size_t k = tier_->reap(c);
      got.insert(got.end(), c, c + k);
      if (k == 0) {
        pollfd p{tier_->wake_fd(), POLLIN, 0};
        (void)::poll(&p, 1, 20);
      }
    }
    EXPECT_EQ(got.size(), n) << "transfers never completed";
    return got;
  }

  Status write(const Placement& p, uint32_t arena_slot, uint64_t key, TransferId id = 1) {
    Transfer t{Transfer::Direction::kWrite, p,  slot(arena_slot),
               model_.chunk_bytes,          id, ChunkIdentity{K(key), model_.fingerprint}};
    KDN_RETURN_IF_ERROR(tier_->submit(t));
    return one_status(wait_for(1));
  }

  Status read(const Placement& p, uint32_t arena_slot, TransferId id = 2) {
    Transfer t{Transfer::Direction::kRead, p, slot(arena_slot), model_.chunk_bytes, id, {}};
    KDN_RETURN_IF_ERROR(tier_->submit(t));
    return one_status(wait_for(1));
  }

  static Status one_status(const std::vector<TierCompletion>& got) {
    return got.empty() ? Status(Code::kTimeout, "the transfer never completed") : got[0].status;
  }

  Placement alloc() {
    auto p = tier_->allocate(model_.chunk_bytes);
    EXPECT_TRUE(p.ok()) << p.status().what();
    return p.ok() ? *p : Placement{};
  }

  bool same(uint32_t a, uint32_t b) { return std::memcmp(slot(a), slot(b), model_.chunk_bytes) == 0; }

  // The relative Frobenius error of slot b against slot a (fp16).
  double rel_error(uint32_t a, uint32_t b) {
    const auto q = kernels::kvc1_quality(kernels::kvc1_geometry(model_), slot(a), slot(b), 1);
    return q.rel_frobenius_error;
  }

  void damage(uint32_t device, uint64_t offset) {
    const int fd = ::open(tier_->file_path(device).c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    char c = 0;
    ASSERT_EQ(::pread(fd, &c, 1, off_t(offset)), 1);
    c ^= 0x10;
    ASSERT_EQ(::pwrite(fd, &c, 1, off_t(offset)), 1);
    ::close(fd);
  }

  std::string root_;
  std::vector<std::string> dirs_;
  ModelInfo model_{};
  AlignedBuffer arena_;
  DiskTierOptions options_;
  DiskIo io_;
  std::unique_ptr<DiskTier> tier_;
  std::vector<RecoveredChunk> recovered_;
  RecoveryReport report_;
};

TEST_F(DiskTierTest, RoundTripWithEveryCodecAndAfterReopen) {
  for (DiskCodec codec : {DiskCodec::kNone, DiskCodec::kLossless, DiskCodec::kInt8, DiskCodec::kKivi4}) {
    SCOPED_TRACE(disk::disk_codec_name(codec));
    options_.codec = codec;
    options_.name_space = std::string("codec-") + disk::disk_codec_name(codec);
    ASSERT_TRUE(open().ok());
    EXPECT_TRUE(report_.created);
    fill(0, 11);
    const Placement p = alloc();
    ASSERT_TRUE(write(p, 0, 1).ok());
    std::memset(slot(1), 0, model_.chunk_bytes);
    ASSERT_TRUE(read(p, 1).ok());
    const bool exact = codec == DiskCodec::kNone || codec == DiskCodec::kLossless;
    if (exact)
      EXPECT_TRUE(same(0, 1));
    else
      EXPECT_LT(rel_error(0, 1), codec == DiskCodec::kInt8 ? 0.02 : 0.15);
    const DiskCounters& c = tier_->counters();
    if (codec != DiskCodec::kNone) {
      EXPECT_EQ(c.encoded_writes, 1u) << "synthetic KV compresses";
      EXPECT_LT(c.stored_bytes_written, c.raw_bytes_written);
    }
    // A restart finds it from its header alone and serves the same bytes.
    ASSERT_TRUE(open().ok());
    ASSERT_EQ(recovered_.size(), 1u);
    EXPECT_EQ(recovered_[0].key, K(1));
    EXPECT_EQ(recovered_[0].fingerprint, model_.fingerprint);
    std::memset(slot(2), 0, model_.chunk_bytes);
    ASSERT_TRUE(read(recovered_[0].placement, 2).ok());
    EXPECT_TRUE(same(1, 2)) << "the same stored bytes decode the same way";
  }
}

TEST_F(DiskTierTest, ChunksStripeOverDirectoriesAndRecoverTheNewestCopy) {
  ASSERT_TRUE(open().ok());
  std::vector<Placement> ps;
  for (uint32_t i = 0; i < 12; ++i) {
    fill(i, 100 + i);
    ps.push_back(alloc());
    ASSERT_TRUE(write(ps.back(), i, i).ok());
  }
  uint32_t per_dir[2] = {};
  for (const Placement& p : ps) {
    uint32_t d = 0;
    uint64_t off = 0, stored = 0;
    ASSERT_TRUE(tier_->locate(p, &d, &off, &stored));
    ++per_dir[d];
  }
  EXPECT_EQ(per_dir[0], 6u);
  EXPECT_EQ(per_dir[1], 6u);
  // Key 3 written again elsewhere with other bytes, the old slot freed but not erased: the
  // newer copy wins at recovery.
  fill(20, 999);
  const Placement again = alloc();
  ASSERT_TRUE(write(again, 20, 3).ok());
  tier_->free(ps[3]);
  ASSERT_TRUE(open().ok());
  EXPECT_EQ(recovered_.size(), 12u);
  EXPECT_EQ(report_.stale, 1u);
  for (const RecoveredChunk& rc : recovered_) {
    std::memset(slot(30), 0, model_.chunk_bytes);
    ASSERT_TRUE(read(rc.placement, 30).ok());
    const uint32_t i = uint32_t(rc.key.hi);
    EXPECT_TRUE(same(i == 3 ? 20 : i, 30)) << "key " << i;
  }
}

TEST_F(DiskTierTest, QueueDepthCapsInFlightAndEverythingCompletes) {
  options_.queue_depth = 2;
  ASSERT_TRUE(open().ok());
  std::vector<Placement> ps;
  for (uint32_t i = 0; i < 40; ++i) {
    fill(i, i);
    ps.push_back(alloc());
    Transfer t{Transfer::Direction::kWrite, ps[i],   slot(i),
               model_.chunk_bytes,          100 + i, ChunkIdentity{K(i), model_.fingerprint}};
    ASSERT_TRUE(tier_->submit(t).ok());
  }
  auto done = wait_for(40);
  for (auto& c : done) EXPECT_TRUE(c.status.ok());
  EXPECT_GT(tier_->ring_counters().queued_max, 0u) << "requests waited behind the cap";
  for (uint32_t i = 0; i < 40; ++i) {
    Transfer t{Transfer::Direction::kRead, ps[i], slot(40 + i), model_.chunk_bytes, 200 + i, {}};
    ASSERT_TRUE(tier_->submit(t).ok());
  }
  done = wait_for(40);
  for (auto& c : done) EXPECT_TRUE(c.status.ok());
  for (uint32_t i = 0; i < 40; ++i) EXPECT_TRUE(same(i, 40 + i)) << i;
}

TEST_F(DiskTierTest, InjectedFaultsNeverServeAWrongByte) {
  FaultyDiskIo io;
  ASSERT_TRUE(open(&io).ok());
  fill(0, 5);
  const Placement p = alloc();
  // Short and retried transfers complete correctly.
  constexpr uint32_t kPayload = 8192;  // faults hit payloads, not headers and slab table blocks
  io.fail_next(IoKind::kWrite, -EAGAIN, 1, kPayload);
  io.fail_next(IoKind::kWrite, 4096, 1, kPayload);  // a short write: the rest goes out again
  ASSERT_TRUE(write(p, 0, 1).ok());
  io.fail_next(IoKind::kRead, 8192);  // a short read
  io.fail_next(IoKind::kRead, -EAGAIN);
  std::memset(slot(1), 0, model_.chunk_bytes);
  ASSERT_TRUE(read(p, 1).ok());
  EXPECT_TRUE(same(0, 1));
  EXPECT_GE(tier_->counters().retries, 2u);
  EXPECT_GE(tier_->counters().short_transfers, 2u);
  // EIO on a read: an error, the copy stays and reads fine afterwards.
  io.fail_next(IoKind::kRead, -EIO);
  EXPECT_EQ(read(p, 1).code(), Code::kIo);
  std::memset(slot(1), 0, model_.chunk_bytes);
  ASSERT_TRUE(read(p, 1).ok());
  EXPECT_TRUE(same(0, 1));
  // ENOSPC and EIO on writes: errors, counted by kind.
  const Placement q = alloc();
  io.fail_next(IoKind::kWrite, -ENOSPC, 1, kPayload);
  EXPECT_EQ(write(q, 0, 2).code(), Code::kNoSpace);
  io.fail_next(IoKind::kWrite, -EIO, 1, kPayload);
  EXPECT_EQ(write(q, 0, 2).code(), Code::kIo);
  EXPECT_EQ(tier_->counters().no_space, 1u);
  EXPECT_EQ(tier_->counters().io_errors, 2u);
  // A read that meets the end of the file: the bytes are gone, a corrupt chunk.
  io.fail_next(IoKind::kRead, 0);
  EXPECT_EQ(read(p, 1).code(), Code::kCorrupt);
}

TEST_F(DiskTierTest, FlippedBytesAndTruncatedFilesAreCorruptNeverServed) {
  ASSERT_TRUE(open().ok());
  fill(0, 7);
  const Placement p = alloc();
  ASSERT_TRUE(write(p, 0, 1).ok());
  uint32_t d = 0;
  uint64_t header = 0, stored = 0;
  ASSERT_TRUE(tier_->locate(p, &d, &header, &stored));
  damage(d, header + kBlock + 1000);  // a payload byte
  std::memset(slot(1), 0xAB, model_.chunk_bytes);
  EXPECT_EQ(read(p, 1).code(), Code::kCorrupt);
  EXPECT_EQ(tier_->counters().crc_mismatch, 1u);
  // A damaged header: the slot is not recovered at all.
  fill(2, 8);
  const Placement q = alloc();
  ASSERT_TRUE(write(q, 2, 2).ok());
  uint32_t dq = 0;
  uint64_t hq = 0;
  ASSERT_TRUE(tier_->locate(q, &dq, &hq, &stored));
  damage(dq, hq + 50);
  ASSERT_TRUE(open().ok());
  ASSERT_EQ(recovered_.size(), 1u) << "the chunk with a damaged payload still has its header";
  EXPECT_EQ(recovered_[0].key, K(1));
  EXPECT_EQ(read(recovered_[0].placement, 1).code(), Code::kCorrupt) << "and its payload still fails";
  // A file truncated under the tier: reads past the end are corrupt chunks.
  fill(3, 9);
  const Placement r = alloc();
  ASSERT_TRUE(write(r, 3, 3).ok());
  ASSERT_TRUE(tier_->locate(r, &d, &header, &stored));
  ASSERT_EQ(::truncate(tier_->file_path(d).c_str(), off_t(header + kBlock)), 0);
  EXPECT_EQ(read(r, 4).code(), Code::kCorrupt);
  EXPECT_EQ(tier_->counters().end_of_file, 1u);
  // Reopening a truncated file grows it back with zeros: the header that survived is found,
  // and its payload fails its CRC.
  ASSERT_TRUE(open().ok());
  for (const RecoveredChunk& rc : recovered_)
    if (rc.key == K(3)) EXPECT_EQ(read(rc.placement, 4).code(), Code::kCorrupt);
}

TEST_F(DiskTierTest, DiscardedChunksDoNotComeBackAfterARestart) {
  ASSERT_TRUE(open().ok());
  fill(0, 1);
  const Placement a = alloc(), b = alloc();
  ASSERT_TRUE(write(a, 0, 1).ok());
  ASSERT_TRUE(write(b, 0, 2).ok());
  tier_->discard(a);
  tier_->drain();
  EXPECT_EQ(tier_->counters().header_clears, 1u);
  ASSERT_TRUE(open().ok());
  ASSERT_EQ(recovered_.size(), 1u);
  EXPECT_EQ(recovered_[0].key, K(2));
}

TEST_F(DiskTierTest, DirectoriesThatCannotServeAreClearErrors) {
  options_.dirs = {root_ + "/missing"};
  EXPECT_EQ(open().code(), Code::kNotFound);
  options_.dirs = dirs_;
  FaultyDiskIo ro;
  ro.fail_open("test", EROFS);  // creating <dir>/test
  EXPECT_EQ(open(&ro).code(), Code::kIo) << "a read-only directory";
  FaultyDiskIo no_direct;
  no_direct.fail_open("slabs.kdn", EINVAL);
  EXPECT_EQ(open(&no_direct).code(), Code::kUnsupported) << "a file system without O_DIRECT";
  FaultyDiskIo full;
  full.fallocate_errno = ENOSPC;
  EXPECT_EQ(open(&full).code(), Code::kNoSpace);
  // A file of another geometry is refused, not reinterpreted.
  ASSERT_TRUE(open().ok());
  options_.slab_bytes = 8 * kMiB;
  EXPECT_EQ(open().code(), Code::kInvalidArgument);
  options_.slab_bytes = 4 * kMiB;
  // A file whose superblock is damaged is moved aside; the tier starts empty.
  ASSERT_TRUE(open().ok());
  fill(0, 3);
  ASSERT_TRUE(write(alloc(), 0, 1).ok());
  tier_.reset();
  {
    const int fd = ::open((dirs_[0] + "/test/slabs.kdn").c_str(), O_RDWR);
    char junk[8] = "garbage";
    ASSERT_EQ(::pwrite(fd, junk, sizeof junk, 0), ssize_t(sizeof junk));
    ::close(fd);
  }
  ASSERT_TRUE(open().ok());
  EXPECT_TRUE(report_.created);
  bool aside = false;
  for (auto& e : std::filesystem::directory_iterator(dirs_[0] + "/test"))
    aside |= e.path().filename().string().rfind("slabs.kdn.unreadable-", 0) == 0;
  EXPECT_TRUE(aside);
}

TEST_F(DiskTierTest, UnregisteredBuffersWorkTheSame) {
  options_.register_buffers = false;
  ASSERT_TRUE(open().ok());
  EXPECT_FALSE(tier_->buffers_registered());
  fill(0, 4);
  const Placement p = alloc();
  ASSERT_TRUE(write(p, 0, 1).ok());
  ASSERT_TRUE(read(p, 1).ok());
  EXPECT_TRUE(same(0, 1));
  EXPECT_EQ(tier_->ring_counters().fixed, 0u);
}

TEST_F(DiskTierTest, FixedBuffersServeArenaTransfers) {
  ASSERT_TRUE(open().ok());
  if (!tier_->buffers_registered())
    KDN_SKIP_OR_FAIL("MEMLOCK", "this process may not register buffers (RLIMIT_MEMLOCK)");
  fill(0, 4);
  const Placement p = alloc();
  ASSERT_TRUE(write(p, 0, 1).ok());
  ASSERT_TRUE(read(p, 1).ok());
  EXPECT_TRUE(same(0, 1));
  EXPECT_GE(tier_->ring_counters().fixed, 3u) << "payload, header and read all went through fixed buffers";
}

TEST_F(DiskTierTest, BacklogWritesRawAndTheIdlePassReencodes) {
  options_.codec = DiskCodec::kLossless;
  options_.encode_queue = 0;  // encoders never keep up: every demotion goes raw
  options_.idle_ns = 0;
  ASSERT_TRUE(open().ok());
  std::vector<Placement> ps;
  for (uint32_t i = 0; i < 4; ++i) {
    fill(i, 50 + i);
    ps.push_back(alloc());
    ASSERT_TRUE(write(ps.back(), i, i).ok());
  }
  EXPECT_EQ(tier_->counters().raw_for_backlog, 4u);
  EXPECT_EQ(tier_->pending_reencode(), 4u);
  const uint64_t used_before = tier_->used_bytes();
  const uint64_t deadline = now_ns() + 10'000'000'000;
  while (tier_->pending_reencode() > 0 && now_ns() < deadline) {
    tier_->housekeeping(now_ns());
    tier_->service();
    pollfd p{tier_->wake_fd(), POLLIN, 0};
    (void)::poll(&p, 1, 10);
  }
  tier_->drain();
  EXPECT_EQ(tier_->pending_reencode(), 0u);
  EXPECT_EQ(tier_->counters().reencoded, 4u);
  EXPECT_LT(tier_->used_bytes(), used_before) << "re-encoded chunks moved to smaller slots";
  for (uint32_t i = 0; i < 4; ++i) {
    std::memset(slot(10), 0, model_.chunk_bytes);
    ASSERT_TRUE(read(ps[i], 10).ok());
    EXPECT_TRUE(same(i, 10)) << i;
  }
  ASSERT_TRUE(open().ok());
  EXPECT_EQ(recovered_.size(), 4u);
  EXPECT_EQ(report_.stale, 4u) << "the raw copies are older";
  for (const RecoveredChunk& rc : recovered_) {
    ASSERT_TRUE(read(rc.placement, 10).ok());
    EXPECT_TRUE(same(uint32_t(rc.key.hi), 10));
  }
}

TEST_F(DiskTierTest, FullTierSaysNoSpaceAndFreedSlotsComeBack) {
  options_.bytes_per_dir = 4 * kMiB;  // one slab of 31 slots per directory
  ASSERT_TRUE(open().ok());
  std::vector<Placement> ps;
  for (;;) {
    auto p = tier_->allocate(model_.chunk_bytes);
    if (!p.ok()) {
      EXPECT_EQ(p.status().code(), Code::kNoSpace);
      break;
    }
    ps.push_back(*p);
  }
  EXPECT_EQ(ps.size(), 2 * ((4 * kMiB) / (model_.chunk_bytes + kBlock)));
  tier_->free(ps.back());
  EXPECT_TRUE(tier_->allocate(model_.chunk_bytes).ok());
}

}  // namespace
}  // namespace kdn::sidecar
