// DiskIo: the I/O seam under T2 (LevelDB's Env). Every system call the disk tier makes on its
// directories and slab files goes through it, and every io_uring completion passes through
// completed() before the tier acts on it, so a test injects the faults a real device has — EIO,
// ENOSPC, short reads and writes, EAGAIN, a directory that is missing or read-only, a file
// system without O_DIRECT — and they take exactly the path a real fault would.
//
// DiskIo::system() is the real thing. FaultyDiskIo (below) wraps it and fails on command.
//
// Results follow liburing's convention: a non-negative value, or -errno.
// Thread safety: called from the event loop thread only (and, at start-up, from the thread
// opening the tier).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <deque>
#include <string>

namespace kdn::sidecar {

enum class IoKind : uint8_t { kRead = 1, kWrite = 2, kSync = 3 };

class DiskIo {
 public:
  virtual ~DiskIo() = default;

  // Names relative to a directory the tier holds open and has checked (openat, mkdirat): a
  // directory swapped in under the same path later is never used.
  virtual int mkdirat(int dir_fd, const std::string& name, mode_t mode) noexcept;  // 0 or -errno (-EEXIST too)
  virtual int openat(int dir_fd, const std::string& name, int flags, mode_t mode) noexcept;  // fd or -errno
  virtual int file_size(int fd, uint64_t* bytes) noexcept;                                   // fstat
  virtual int fallocate(int fd, uint64_t offset, uint64_t bytes) noexcept;
  virtual int truncate(int fd, uint64_t bytes) noexcept;
  // Synchronous positional I/O, for start-up only (creating files, the superblock).
  virtual ssize_t pwrite(int fd, const void* buf, size_t bytes, uint64_t offset) noexcept;
  virtual ssize_t pread(int fd, void* buf, size_t bytes, uint64_t offset) noexcept;
  virtual int fdatasync(int fd) noexcept;
  // An io_uring completion of `kind` on `device` (the directory's index) at file `offset`
  // for `bytes`, with the kernel's result `res`; returns the result the tier sees.
  virtual int32_t completed(IoKind kind, uint32_t device, uint64_t offset, uint32_t bytes, int32_t res) noexcept {
    (void)kind, (void)device, (void)offset, (void)bytes;
    return res;
  }

  static DiskIo& system() noexcept;
};

// A DiskIo that fails on command (tests). Faults are consumed in order, each by the first
// matching call or completion.
class FaultyDiskIo final : public DiskIo {
 public:
  struct Fault {
    IoKind kind = IoKind::kRead;
    int32_t result = 0;      // -errno, or a byte count smaller than asked (a short transfer)
    uint32_t times = 1;      // consecutive completions it applies to
    uint32_t min_bytes = 0;  // only completions of transfers at least this long (payloads, not
                             // 4 KiB headers and table blocks)
  };
  // The next completions of `kind` get `result` instead of theirs.
  void fail_next(IoKind kind, int32_t result, uint32_t times = 1, uint32_t min_bytes = 0) {
    faults_.push_back({kind, result, times, min_bytes});
  }
  // openat() of names containing `substring` fails with -err; mkdirat() of them too.
  void fail_open(std::string substring, int err) {
    open_fault_ = std::move(substring);
    open_errno_ = err;
  }
  // fallocate fails with -err (a file system without it, a full disk at creation).
  int fallocate_errno = 0;
  uint64_t injected() const noexcept { return injected_; }
  size_t pending() const noexcept { return faults_.size(); }

  int mkdirat(int dir_fd, const std::string& name, mode_t mode) noexcept override;
  int openat(int dir_fd, const std::string& name, int flags, mode_t mode) noexcept override;
  int fallocate(int fd, uint64_t offset, uint64_t bytes) noexcept override;
  int32_t completed(IoKind kind, uint32_t device, uint64_t offset, uint32_t bytes, int32_t res) noexcept override;

 private:
  std::deque<Fault> faults_;
  std::string open_fault_;
  int open_errno_ = 0;
  uint64_t injected_ = 0;
};

}  // namespace kdn::sidecar
