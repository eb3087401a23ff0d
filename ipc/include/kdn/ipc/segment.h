// SharedSegment: a memfd and its MAP_SHARED mapping, owned together.
//
// kdnd creates every shared segment (session segments, host arenas, staging areas) with
// create() and hands the fd to clients over the handshake socket; clients map it with
// attach(). Because a client could ftruncate a shared memfd smaller and make the daemon's
// next access SIGBUS, create() seals the size by default (F_SEAL_SHRINK | F_SEAL_GROW |
// F_SEAL_SEAL) before any fd leaves the daemon. attach() still checks with fstat that the file
// is at least the size the peer announced, so a short file is an error, never a SIGBUS.
//
// A segment only its creator may write (a host arena: chunks must not change after commit)
// is created with seal_writes: the creator maps it read-write first, then seals it with
// F_SEAL_FUTURE_WRITE. From then on nobody else can map it writable (EPERM), upgrade a
// read-only mapping (mprotect: EACCES), write(2) to it, or punch holes into it
// (fallocate/madvise(MADV_REMOVE): EPERM), whatever descriptor or /proc/self/fd re-open they
// use; the creator's own mapping stays writable. (F_SEAL_WRITE would refuse while that
// mapping exists, and Linux cannot revoke a mapping, so FUTURE_WRITE is the seal that fits.)
//
// Plain POSIX (memfd_create/mmap) rather than Boost.Interprocess: our segments are anonymous
// memfds that travel by SCM_RIGHTS and must be sealed and optionally backed by huge pages;
// Boost.Interprocess names segments in /dev/shm and reports errors by exception. See
// docs/protocol.md.
//
// Move-only, not thread-safe to mutate; the mapped bytes themselves are shared memory and
// follow the protocol's rules.
#pragma once

#include <kdn/common/status.h>
#include <kdn/ipc/fd.h>

#include <cstddef>
#include <cstdint>

namespace kdn::ipc {

struct SegmentOptions {
  bool huge_pages = false;    // try MFD_HUGETLB (2 MiB pages); falls back to normal pages
  bool seal_size = true;      // F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL after sizing
  bool seal_writes = false;   // + F_SEAL_FUTURE_WRITE after mapping: only this mapping writes
  bool populate = false;      // MAP_POPULATE: fault every page in now
  bool madvise_huge = false;  // MADV_HUGEPAGE (transparent huge pages) on normal pages
};

struct MapOptions {
  bool populate = false;
  bool madvise_huge = false;
  bool read_only = false;  // PROT_READ only
};

class SharedSegment {
 public:
  SharedSegment() noexcept = default;
  SharedSegment(SharedSegment&& o) noexcept;
  SharedSegment& operator=(SharedSegment&& o) noexcept;
  SharedSegment(const SharedSegment&) = delete;
  SharedSegment& operator=(const SharedSegment&) = delete;
  ~SharedSegment();

  // Creates a memfd named `name` (for /proc/<pid>/fd; need not be unique) of `bytes` bytes
  // (rounded up to the page size, huge page size with huge pages) and maps it read-write.
  static Result<SharedSegment> create(const char* name, uint64_t bytes, const SegmentOptions& options = {}) noexcept;

  // Maps a received fd (ownership taken) whose peer announced `expected_bytes`. Errors:
  // KDN_ERR_PROTOCOL if fd is not a regular file/memfd or is shorter than expected_bytes,
  // KDN_ERR_IO / KDN_ERR_NO_MEMORY if mmap fails. Maps exactly expected_bytes.
  static Result<SharedSegment> attach(UniqueFd fd, uint64_t expected_bytes, const MapOptions& options = {}) noexcept;

  std::byte* data() const noexcept { return base_; }
  uint64_t size() const noexcept { return bytes_; }
  int fd() const noexcept { return fd_.get(); }
  bool huge_pages() const noexcept { return huge_; }
  bool valid() const noexcept { return base_ != nullptr; }

  // A new descriptor for the same memfd (for sending; the segment keeps its own).
  Result<UniqueFd> dup_fd() const noexcept;

 private:
  void unmap() noexcept;

  UniqueFd fd_;
  std::byte* base_ = nullptr;
  uint64_t bytes_ = 0;
  bool huge_ = false;
};

// Seals currently set on fd (F_GET_SEALS), or an error if it cannot be queried.
Result<uint32_t> segment_seals(int fd) noexcept;

}  // namespace kdn::ipc
