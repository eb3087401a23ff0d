// DiskTier: opening, creating and recovering slab files (docs/disk-format.md, "Recovery").
#include "disk/disk_tier_internal.h"

#include <kdn/common/clock.h>
#include <kdn/common/files.h>

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>

namespace kdn::sidecar {

using disk::kBlock;

namespace {

constexpr uint64_t kZeroChunk = 8ull << 20;  // bytes per write while initializing a file
constexpr size_t kHeaderBatch = 4096;        // slot headers read per batch at recovery
constexpr uint64_t kProgressNs = 1'000'000'000;
constexpr const char* kSlabFile = "slabs.kdn";

std::string describe(int err) { return std::string(std::strerror(err)) + " (errno " + std::to_string(err) + ")"; }

}  // namespace

// A header found at recovery, and where.
struct DiskTier::Found {
  uint32_t device = 0;
  uint32_t slab = 0;
  uint32_t index = 0;  // slot within the slab
  disk::SlotHeader header;
};

Result<std::unique_ptr<DiskTier>> DiskTier::open(const DiskTierOptions& options, DiskIo& io,
                                                 std::vector<RecoveredChunk>* recovered,
                                                 RecoveryReport* report) noexcept {
  if (options.dirs.empty()) return Status(Code::kInvalidArgument, "a disk tier without directories");
  if (options.slab_bytes == 0 || options.slab_bytes % kBlock != 0)
    return Status(Code::kInvalidArgument, "tier.disk.slab_bytes must be a multiple of 4 KiB");
  if (options.bytes_per_dir < options.slab_bytes)
    return Status(Code::kInvalidArgument, "tier.disk.bytes is smaller than one slab");
  std::unique_ptr<DiskTier> t(new (std::nothrow) DiskTier(options, io));
  if (!t) return Status(Code::kNoMemory, "disk tier allocation failed");
  t->wake_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!t->wake_) return Status::from_errno("eventfd for the disk tier", errno);
  try {
    t->workers_ = std::make_unique<Workers>(options.workers, t->wake_.get());
  } catch (...) {
    return Status(Code::kNoMemory, "disk tier workers");
  }
  RecoveryReport local;
  KDN_RETURN_IF_ERROR(t->open_devices(recovered, report ? report : &local));
  KDN_RETURN_IF_ERROR(t->register_buffers());
  t->last_transfer_ns_ = now_ns();
  return t;
}

// ---- one directory's file ----------------------------------------------------------------------

namespace {

// Writes zeros over [from, to) of a fresh file, so every extent is written once.
Status zero_fill(DiskIo& io, int fd, uint64_t from, uint64_t to, const std::string& path) {
  AlignedBuffer zeros(kZeroChunk);
  if (!zeros.data()) return Status(Code::kNoMemory, "zero buffer");
  std::memset(zeros.data(), 0, zeros.size());
  uint64_t last_log = now_ns();
  for (uint64_t off = from; off < to;) {
    const uint64_t n = std::min<uint64_t>(kZeroChunk, to - off);
    const ssize_t w = io.pwrite(fd, zeros.data(), n, off);
    if (w < 0) {
      spdlog::error("disk tier: initializing {}: {}", path, describe(int(-w)));
      return w == -ENOSPC ? Status(Code::kNoSpace, "no room for the slab file (tier.disk.bytes)")
                          : Status::from_errno("writing a new slab file", int(-w));
    }
    if (w == 0) return Status(Code::kIo, "writing a new slab file made no progress");
    off += uint64_t(w);
    if (now_ns() - last_log > kProgressNs) {
      spdlog::info("disk tier: initializing {}: {} of {} MiB", path, off >> 20, to >> 20);
      last_log = now_ns();
    }
  }
  return OkStatus();
}

}  // namespace

// <root>/<namespace>, opened under a checked descriptor of root: both directories must be
// kdnd's (or root's), writable by no one else and not symlinks, or another local user could
// plant a slab file with valid checksums whose bytes kdnd would serve as cached KV.
Status DiskTier::open_device_dir(Device& d, const std::string& root) noexcept {
  d.dir = root + "/" + options_.name_space;
  d.path = d.dir + "/" + kSlabFile;
  std::string error;
  Result<int> root_fd = open_private_dir(root, "tier.disk.dirs", &error);
  if (!root_fd.ok()) {
    spdlog::error("{}", error);
    return root_fd.status().code() == Code::kIo && root_fd.status().sys_errno() == ENOENT
               ? Status(Code::kNotFound, "a disk directory does not exist")
               : root_fd.status();
  }
  ipc::UniqueFd root_dir(*root_fd);
  const int mk = io_.mkdirat(root_dir.get(), options_.name_space, 0700);
  if (mk < 0 && mk != -EEXIST) {
    spdlog::error("tier.disk.dirs: cannot create '{}': {}", d.dir, describe(-mk));
    return Status::from_errno("a disk directory is not writable", -mk);
  }
  const int fd = io_.openat(root_dir.get(), options_.name_space, O_RDONLY | O_DIRECTORY | O_NOFOLLOW, 0);
  if (fd < 0) {
    const bool link = fd == -ELOOP || fd == -ENOTDIR;
    spdlog::error("tier.disk.dirs: {} {}", d.dir,
                  link ? "is a symlink or not a directory; kdnd keeps its slab files "
                         "only in a directory it made"
                       : "cannot be opened: " + describe(-fd));
    return link ? Status(Code::kPermission, "a namespace's disk directory is a symlink")
                : Status::from_errno("cannot open a disk directory", -fd);
  }
  d.dir_fd.reset(fd);
  if (Status st = check_private_dir_fd(fd, "disk directory " + d.dir, &error); !st.ok()) {
    spdlog::error("tier.disk.dirs: {}", error);
    return st;
  }
  return OkStatus();
}

// A slab file another user can write (or that has another name somewhere) is refused, not
// repaired: its contents may already be someone else's.
Status DiskTier::check_slab_file(const Device& d) noexcept {
  std::string error;
  Status st = check_private_file_fd(d.fd.get(), "slab file " + d.path, &error);
  if (!st.ok()) spdlog::error("tier.disk.dirs: {}; remove it to start empty", error);
  return st;
}

// open_devices in four steps: each directory's slab file opened or created (its superblock
// checked or written), its slab table read and its ring made; then every slot header of the slabs
// in use read back; then the newest copy of each key adopted into the allocators and the index.
Status DiskTier::open_devices(std::vector<RecoveredChunk>* recovered, RecoveryReport* report) noexcept {
  const uint64_t t0 = now_ns();
  const disk::FileLayout want = disk::FileLayout::for_data_bytes(options_.bytes_per_dir, options_.slab_bytes);
  for (uint32_t i = 0; i < options_.dirs.size(); ++i) KDN_RETURN_IF_ERROR(open_device(i, want, report));
  std::vector<Found> found;
  uint64_t last_log = t0;
  for (auto& d : devices_) KDN_RETURN_IF_ERROR(scan_device(*d, report, &found, &last_log));
  KDN_RETURN_IF_ERROR(adopt_newest(found, recovered, report));
  report->seconds = double(now_ns() - t0) / 1e9;
  return OkStatus();
}

Status DiskTier::open_device(uint32_t i, const disk::FileLayout& want, RecoveryReport* report) noexcept {
  try {
    auto d = std::make_unique<Device>();
    d->index = i;
    KDN_RETURN_IF_ERROR(open_device_dir(*d, options_.dirs[i]));
    bool create = false;
    KDN_RETURN_IF_ERROR(open_slab_file(*d, want, &create));
    if (create) {
      report->created = true;
      KDN_RETURN_IF_ERROR(create_slab_file(*d, want));
    }
    KDN_RETURN_IF_ERROR(load_slab_table(*d));
    devices_.push_back(std::move(d));
    return OkStatus();
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoMemory, "opening the disk tier");
  }
}

// An existing slab file, checked: its superblock read (one that cannot be trusted moves the file
// aside and asks for a new one), its geometry against the configuration's, a short file
// zero-filled to its length. *create says no usable file is there.
Status DiskTier::open_slab_file(Device& d, const disk::FileLayout& want, bool* create) noexcept {
  const std::string& dir = options_.dirs[d.index];
  const int fd = io_.openat(d.dir_fd.get(), kSlabFile, O_RDWR | O_DIRECT | O_NOFOLLOW, 0);
  if (fd == -EINVAL) {
    spdlog::error(
        "tier.disk.dirs: the file system of '{}' does not support O_DIRECT; T2 needs direct I/O "
        "(use a directory on ext4, xfs or btrfs)",
        dir);
    return Status(Code::kUnsupported, "a disk directory's file system has no O_DIRECT");
  }
  if (fd == -ELOOP) {
    spdlog::error("tier.disk.dirs: slab file {} is a symlink; kdnd writes only a file it created there", d.path);
    return Status(Code::kPermission, "a slab file is a symlink");
  }
  *create = fd == -ENOENT;
  if (*create) return OkStatus();
  if (fd < 0) {
    spdlog::error("tier.disk.dirs: cannot open '{}': {}", d.path, describe(-fd));
    return Status::from_errno("cannot open a slab file", -fd);
  }
  d.fd.reset(fd);
  KDN_RETURN_IF_ERROR(check_slab_file(d));
  AlignedBuffer block(kBlock);
  if (!block.data()) return Status(Code::kNoMemory, "superblock buffer");
  const ssize_t r = io_.pread(fd, block.data(), kBlock, 0);
  Status sb = r == ssize_t(kBlock) ? disk::decode_superblock(block.data(), &d.super)
                                   : Status(Code::kCorrupt, "superblock unreadable");
  if (sb.ok() && d.super.name_space != options_.name_space)
    sb = Status(Code::kCorrupt, "superblock of another namespace");
  if (sb.code() == Code::kVersion) {
    spdlog::error("disk tier: {} was written by a newer kdnd (format major other than {}); refusing to touch it",
                  d.path, disk::kFormatMajor);
    return sb;
  }
  if (!sb.ok()) {
    // Nothing in it can be trusted without its superblock: keep it for inspection, start anew.
    const std::string aside = d.path + ".unreadable-" + std::to_string(disk_detail::now_unix_ns() / 1'000'000'000);
    spdlog::error("disk tier: {}: {}; moved to {} and starting with an empty file", d.path, sb.what(), aside);
    d.fd.reset();
    const std::string aside_name = aside.substr(d.dir.size() + 1);
    if (::renameat(d.dir_fd.get(), kSlabFile, d.dir_fd.get(), aside_name.c_str()) != 0)
      return Status::from_errno("moving a damaged slab file aside", errno);
    *create = true;
    return OkStatus();
  }
  if (d.super.layout.slab_bytes != want.slab_bytes || d.super.layout.slab_count != want.slab_count) {
    spdlog::error(
        "disk tier: {} holds {} slabs of {} MiB, but tier.disk.bytes and tier.disk.slab_bytes ask for {} "
        "of {} MiB: set them back, or remove the file to start empty",
        d.path, d.super.layout.slab_count, d.super.layout.slab_bytes >> 20, want.slab_count, want.slab_bytes >> 20);
    return Status(Code::kInvalidArgument, "a slab file of another geometry");
  }
  uint64_t size = 0;
  if (io_.file_size(d.fd.get(), &size) == 0 && size < d.super.layout.file_bytes) {
    spdlog::warn(
        "disk tier: {} is {} bytes, shorter than its {} (truncated?): the missing part is lost and "
        "written anew",
        d.path, size, d.super.layout.file_bytes);
    (void)io_.fallocate(d.fd.get(), size / kBlock * kBlock, d.super.layout.file_bytes - size / kBlock * kBlock);
    KDN_RETURN_IF_ERROR(zero_fill(io_, d.fd.get(), size / kBlock * kBlock, d.super.layout.file_bytes, d.path));
  }
  return OkStatus();
}

// A new slab file of the configured geometry: 0600, allocated, zero-filled, and its superblock
// written last, so a file without one is a file whose creation did not finish.
Status DiskTier::create_slab_file(Device& d, const disk::FileLayout& want) noexcept {
  const std::string& dir = options_.dirs[d.index];
  const int fd = io_.openat(d.dir_fd.get(), kSlabFile, O_RDWR | O_CREAT | O_EXCL | O_DIRECT | O_NOFOLLOW, 0600);
  if (fd < 0) {
    spdlog::error("tier.disk.dirs: cannot create '{}': {}", d.path, describe(-fd));
    return fd == -EINVAL ? Status(Code::kUnsupported, "a disk directory's file system has no O_DIRECT")
                         : Status::from_errno("cannot create a slab file", -fd);
  }
  d.fd.reset(fd);
  (void)::fchmod(fd, 0600);  // open applied the umask; the mode is the file's only guard
  const int fa = io_.fallocate(fd, 0, want.file_bytes);
  if (fa == -ENOSPC) {
    spdlog::error("tier.disk.dirs: '{}' has no room for {} MiB (tier.disk.bytes)", dir, want.file_bytes >> 20);
    ::unlinkat(d.dir_fd.get(), kSlabFile, 0);
    return Status(Code::kNoSpace, "no room for the slab file (tier.disk.bytes)");
  }
  spdlog::info("disk tier: creating {} ({} MiB, {} slabs of {} MiB)", d.path, want.file_bytes >> 20, want.slab_count,
               want.slab_bytes >> 20);
  Status z = zero_fill(io_, fd, 0, want.file_bytes, d.path);
  if (!z.ok()) {
    ::unlinkat(d.dir_fd.get(), kSlabFile, 0);
    return z;
  }
  d.super = disk::Superblock{};
  if (::getrandom(d.super.file_id, sizeof d.super.file_id, 0) != ssize_t(sizeof d.super.file_id)) {
    const uint64_t seed[2] = {disk_detail::now_unix_ns(), uint64_t(::getpid())};
    std::memcpy(d.super.file_id, seed, sizeof seed);
  }
  d.super.name_space = options_.name_space;
  d.super.dir_index = d.index;
  d.super.dir_count = uint32_t(options_.dirs.size());
  d.super.layout = want;
  d.super.created_unix_ns = disk_detail::now_unix_ns();
  AlignedBuffer block(kBlock);
  if (!block.data()) return Status(Code::kNoMemory, "superblock buffer");
  disk::encode_superblock(d.super, block.data());
  if (io_.pwrite(fd, block.data(), kBlock, 0) != ssize_t(kBlock) || io_.fdatasync(fd) != 0) {
    spdlog::error("disk tier: writing the superblock of {} failed", d.path);
    return Status(Code::kIo, "writing a superblock failed");
  }
  return OkStatus();
}

// The device's allocator, its slab table read into memory, and its io_uring ring.
Status DiskTier::load_slab_table(Device& d) noexcept {
  const disk::FileLayout& l = d.super.layout;
  d.alloc = std::make_unique<SlabAllocator>(uint64_t{l.slab_count} * l.slab_bytes, l.slab_bytes);
  d.table = AlignedBuffer(l.data_offset - l.table_offset);
  if (!d.table.data()) return Status(Code::kNoMemory, "slab table buffer");
  const uint64_t blocks = d.table.size() / kBlock;
  d.table_writing.assign(blocks, 0);
  d.table_dirty.assign(blocks, 0);
  if (io_.pread(d.fd.get(), d.table.data(), d.table.size(), l.table_offset) != ssize_t(d.table.size())) {
    spdlog::error("disk tier: reading the slab table of {} failed", d.path);
    return Status(Code::kIo, "reading a slab table failed");
  }
  const int files[1] = {d.fd.get()};
  auto ring = DiskRing::create(options_.queue_depth, files, wake_.get(), io_, d.index);
  if (!ring.ok()) {
    spdlog::error("disk tier: {}: {}", d.path, ring.status().what());
    return ring.status();
  }
  d.ring = std::move(ring.value());
  return OkStatus();
}

namespace {

// A slot recovery reads the header of.
struct SlotAt {
  uint32_t slab, index;
  uint64_t offset, slot_bytes;
};

// Every slot of the slabs the table says are in use (counted in *slabs); a multi-slab slot only
// when all its continuation entries agree.
std::vector<SlotAt> slots_in_use(const disk::FileLayout& l, const std::byte* table, uint64_t* slabs) {
  std::vector<SlotAt> where;
  auto entry = [&](uint32_t s) {
    return table + (l.table_block_offset(s) - l.table_offset) + disk::FileLayout::entry_in_block(s);
  };
  for (uint32_t s = 0; s < l.slab_count;) {
    disk::SlabEntry e;
    if (!disk::decode_slab_entry(entry(s), &e) || e.continuation) {
      ++s;
      continue;
    }
    ++*slabs;
    if (e.slot_bytes <= l.slab_bytes) {
      for (uint32_t i = 0; i < l.slab_bytes / e.slot_bytes; ++i)
        where.push_back({s, i, l.slab_offset(s) + uint64_t{i} * e.slot_bytes, e.slot_bytes});
      ++s;
      continue;
    }
    const uint32_t span = uint32_t((e.slot_bytes + l.slab_bytes - 1) / l.slab_bytes);
    bool whole = uint64_t{s} + span <= l.slab_count;
    for (uint32_t k = 1; whole && k < span; ++k) {
      disk::SlabEntry c;
      whole = disk::decode_slab_entry(entry(s + k), &c) && c.continuation && c.slot_bytes == e.slot_bytes;
    }
    if (whole) where.push_back({s, 0, l.slab_offset(s), e.slot_bytes});
    s += whole ? span : 1;
  }
  return where;
}

}  // namespace

// Every slot header of the device's slabs in use, read through its ring in batches; the headers
// that name this file, this slot and this namespace are found.
Status DiskTier::scan_device(Device& d, RecoveryReport* report, std::vector<Found>* found,
                             uint64_t* last_log) noexcept {
  std::vector<SlotAt> where;
  std::vector<IoRequest> reqs;
  try {
    where = slots_in_use(d.super.layout, d.table.data(), &report->slabs_scanned);
    reqs.resize(std::min(where.size(), kHeaderBatch));
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoMemory, "recovery slot list");
  }
  AlignedBuffer headers(std::min(where.size(), kHeaderBatch) * kBlock + kBlock);
  if (!headers.data()) return Status(Code::kNoMemory, "recovery header buffer");
  for (size_t first = 0; first < where.size(); first += kHeaderBatch) {
    const size_t n = std::min(kHeaderBatch, where.size() - first);
    for (size_t i = 0; i < n; ++i) {
      reqs[i] = IoRequest{IoKind::kRead, 0, where[first + i].offset, headers.data() + i * kBlock, kBlock};
      d.ring->submit(&reqs[i]);
    }
    size_t finished = 0;
    while (finished < n) {
      KDN_RETURN_IF_ERROR(d.ring->flush());
      finished += d.ring->reap([](IoRequest*) {});
      if (finished < n) KDN_RETURN_IF_ERROR(d.ring->wait());
    }
    report->headers_read += n;
    for (size_t i = 0; i < n; ++i) {
      const SlotAt& w = where[first + i];
      disk::SlotHeader h;
      if (reqs[i].result != 0 || !disk::decode_slot_header(headers.data() + i * kBlock, &h).ok() ||
          std::memcmp(h.file_id, d.super.file_id, 16) != 0 || h.slot_offset != w.offset ||
          h.slot_bytes != w.slot_bytes || h.name_space != options_.name_space) {
        ++report->invalid;
        continue;
      }
      try {
        found->push_back({d.index, w.slab, w.index, std::move(h)});
      } catch (const std::bad_alloc&) {
        return Status(Code::kNoMemory, "recovery");
      }
    }
    if (now_ns() - *last_log > kProgressNs) {
      spdlog::info("namespace '{}': disk tier recovery: {} slot headers read, {} chunks found", options_.name_space,
                   report->headers_read, found->size());
      *last_log = now_ns();
    }
  }
  return OkStatus();
}

// The newest copy of each key wins; the slots it lives in are taken (a slab is adopted whole by
// the allocator or not at all), the rest stay free; each adopted copy becomes a slot and a
// recovered chunk.
Status DiskTier::adopt_newest(const std::vector<Found>& found, std::vector<RecoveredChunk>* recovered,
                              RecoveryReport* report) noexcept {
  std::unordered_map<kdn_key, size_t, KeyHash> newest;
  std::vector<uint8_t> keep;
  try {
    newest.reserve(found.size());
    keep.assign(found.size(), 0);
    for (size_t i = 0; i < found.size(); ++i) {
      auto [it, fresh] = newest.emplace(found[i].header.key, i);
      if (!fresh) {
        ++report->stale;
        if (found[i].header.sequence > found[it->second].header.sequence) it->second = i;
      }
    }
    for (const auto& [key, i] : newest) keep[i] = 1;
    struct SlabSlots {
      uint64_t slot_bytes = 0;
      std::vector<uint32_t> used;
    };
    std::map<std::pair<uint32_t, uint32_t>, SlabSlots> slab_slots;  // (device, slab) -> its slots in use
    for (size_t i = 0; i < found.size(); ++i) {
      if (!keep[i]) continue;
      SlabSlots& ss = slab_slots[{found[i].device, found[i].slab}];
      ss.slot_bytes = found[i].header.slot_bytes;
      ss.used.push_back(found[i].index);
    }
    std::map<std::pair<uint32_t, uint32_t>, bool> adopted;
    for (auto& [where, ss] : slab_slots) {
      SlabAllocator& a = *devices_[where.first]->alloc;
      auto cls = a.class_for(ss.slot_bytes);
      adopted[where] = cls && a.adopt_slab(*cls, where.second, ss.used);
    }
    recovered->reserve(recovered->size() + newest.size());
    slots_.reserve(newest.size());
    for (size_t i = 0; i < found.size(); ++i) {
      if (!keep[i] || !adopted[{found[i].device, found[i].slab}]) continue;
      KDN_RETURN_IF_ERROR(adopt_found(found[i], recovered, report));
    }
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoMemory, "recovery index");
  }
  return OkStatus();
}

// One recovered copy as a live slot, written and placed, and as a chunk for the index.
Status DiskTier::adopt_found(const Found& f, std::vector<RecoveredChunk>* recovered, RecoveryReport* report) {
  const disk::SlotHeader& h = f.header;
  Device& d = *devices_[f.device];
  auto tcls = slot_class(h.raw_bytes);
  auto dcls = d.alloc->class_for(h.slot_bytes);
  if (!tcls.ok() || !dcls) return OkStatus();
  auto handle = new_handle();
  if (!handle.ok()) return handle.status();
  Slot& s = slots_[*handle];
  s.live = s.placed = s.written = true;
  s.device = f.device;
  s.dev_class = *dcls;
  s.tier_class = *tcls;
  s.offset = uint64_t{f.slab} * d.super.layout.slab_bytes + uint64_t{f.index} * h.slot_bytes;
  s.slot_bytes = h.slot_bytes;
  s.raw_bytes = h.raw_bytes;
  s.stored_bytes = h.stored_bytes;
  s.crc = h.payload_crc;
  s.codec = h.codec;
  s.raw_hash = h.raw_hash;
  s.key = h.key;
  s.fingerprint = h.fingerprint;
  s.sequence = h.sequence;
  if (h.codec == disk::DiskCodec::kNone && options_.codec != disk::DiskCodec::kNone && options_.reencode) {
    s.pending_reencode = true;
    ++pending_reencode_;
  }
  next_sequence_ = std::max(next_sequence_, h.sequence + 1);
  recovered->push_back({h.key, h.fingerprint, h.raw_bytes, Placement{*handle, h.raw_bytes, *tcls}});
  ++report->chunks;
  report->bytes += h.raw_bytes;
  return OkStatus();
}

// ---- fixed buffers ---------------------------------------------------------------------------------------

Status DiskTier::register_buffers() noexcept {
  // Headers: a pool for twice the writes the rings can hold at once.
  header_pool_blocks_ = 2ull * options_.queue_depth * devices_.size();
  header_pool_ = static_cast<std::byte*>(std::aligned_alloc(kBlock, header_pool_blocks_ * kBlock));
  if (!header_pool_) return Status(Code::kNoMemory, "disk header pool");
  zero_block_ = static_cast<std::byte*>(std::aligned_alloc(kBlock, kBlock));
  if (!zero_block_) return Status(Code::kNoMemory, "disk header pool");
  std::memset(zero_block_, 0, kBlock);
  try {
    header_free_.reserve(header_pool_blocks_);
    for (uint64_t i = header_pool_blocks_; i-- > 0;) header_free_.push_back(header_pool_ + i * kBlock);
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoMemory, "disk header pool");
  }
  if (!options_.register_buffers) {
    spdlog::info("namespace '{}': disk tier with unregistered buffers (tier.disk.register_buffers = false)",
                 options_.name_space);
    return OkStatus();
  }
  std::vector<iovec> pieces;
  try {
    constexpr uint64_t kPiece = 1ull << 30;  // the kernel refuses larger fixed buffers
    for (uint64_t off = 0; off < options_.arena.size(); off += kPiece)
      pieces.push_back({options_.arena.data() + off, size_t(std::min<uint64_t>(kPiece, options_.arena.size() - off))});
    pieces.push_back({header_pool_, size_t(header_pool_blocks_ * kBlock)});
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoMemory, "disk buffer list");
  }
  registered_ = true;
  for (auto& d : devices_) {
    Status st = d->ring->register_buffers(pieces);
    if (!st.ok()) {
      registered_ = false;
      static bool said = false;  // once per process, not once per namespace (start-up thread only)
      if (said) break;
      said = true;
      rlimit lim{};
      (void)getrlimit(RLIMIT_MEMLOCK, &lim);
      spdlog::warn(
          "namespace '{}': io_uring refused to register the arena as fixed buffers ({}; RLIMIT_MEMLOCK is {} "
          "KiB): disk tiers run with unregistered buffers, a little more CPU per I/O. Raise the limit "
          "(LimitMEMLOCK=infinity in the unit) or give kdnd CAP_IPC_LOCK.",
          options_.name_space, std::strerror(st.sys_errno()),
          lim.rlim_cur == RLIM_INFINITY ? std::string("unlimited") : std::to_string(lim.rlim_cur >> 10));
      break;
    }
  }
  return OkStatus();
}

}  // namespace kdn::sidecar
