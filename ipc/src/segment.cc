#include <kdn/ipc/segment.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <utility>

namespace kdn::ipc {
namespace {

constexpr uint64_t kSmallPage = 4096;
constexpr uint64_t kHugePage = 2ull << 20;
constexpr unsigned kSizeSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010
#endif

constexpr uint64_t round_up(uint64_t bytes, uint64_t unit) noexcept { return (bytes + unit - 1) / unit * unit; }

Status mmap_error(int err) noexcept {
  if (err == ENOMEM) return Status(Code::kNoMemory, "mmap: out of memory");
  return Status::from_errno("mmap", err);
}

Result<std::byte*> map_fd(int fd, uint64_t bytes, bool read_only, bool populate, bool huge) noexcept {
  int prot = read_only ? PROT_READ : PROT_READ | PROT_WRITE;
  int flags = MAP_SHARED | (populate ? MAP_POPULATE : 0);
  void* p = ::mmap(nullptr, bytes, prot, flags, fd, 0);
  if (p == MAP_FAILED) return mmap_error(errno);
  // Advisory only: with transparent huge pages disabled for shmem this fails, and normal
  // pages still work, so the result is deliberately ignored.
  if (huge) (void)::madvise(p, bytes, MADV_HUGEPAGE);
  return static_cast<std::byte*>(p);
}

// A sized memfd; bytes is already rounded to the page size.
Result<UniqueFd> make_memfd(const char* name, uint64_t bytes, bool hugetlb) noexcept {
  unsigned flags = MFD_CLOEXEC | MFD_ALLOW_SEALING | (hugetlb ? MFD_HUGETLB : 0u);
  UniqueFd fd(::memfd_create(name, flags));
  if (!fd) return Status::from_errno("memfd_create", errno);
  if (::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) {
    return Status::from_errno("ftruncate memfd", errno);
  }
  return fd;
}

// Seals a mapped memfd. Sealing the size means no holder of the fd (a client) can shrink the
// file under the daemon's mapping, which would turn the daemon's next access into SIGBUS;
// sealing future writes leaves the creator's mapping the only writable one. One call, since
// F_SEAL_SEAL forbids any later seal.
Status seal_memfd(int fd, const SegmentOptions& options) noexcept {
  unsigned seals =
      (options.seal_size ? kSizeSeals : 0u) | (options.seal_writes ? F_SEAL_FUTURE_WRITE | F_SEAL_SEAL : 0u);
  if (seals != 0 && ::fcntl(fd, F_ADD_SEALS, seals) != 0) return Status::from_errno("seal memfd", errno);
  return OkStatus();
}

}  // namespace

SharedSegment::SharedSegment(SharedSegment&& o) noexcept
    : fd_(std::move(o.fd_)),
      base_(std::exchange(o.base_, nullptr)),
      bytes_(std::exchange(o.bytes_, 0)),
      huge_(std::exchange(o.huge_, false)) {}

SharedSegment& SharedSegment::operator=(SharedSegment&& o) noexcept {
  if (this != &o) {
    unmap();
    fd_ = std::move(o.fd_);
    base_ = std::exchange(o.base_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    huge_ = std::exchange(o.huge_, false);
  }
  return *this;
}

SharedSegment::~SharedSegment() { unmap(); }

void SharedSegment::unmap() noexcept {
  if (base_ != nullptr) ::munmap(base_, bytes_);
  base_ = nullptr;
  bytes_ = 0;
}

Result<SharedSegment> SharedSegment::create(const char* name, uint64_t bytes, const SegmentOptions& options) noexcept {
  if (bytes == 0 || bytes > (1ull << 46)) return Status(Code::kInvalidArgument, "segment size out of range");
  if (options.huge_pages) {
    // Huge pages may be unavailable (none reserved, no hugetlbfs): fall back silently to
    // normal pages, which are always correct, just slower to fault in.
    uint64_t huge_bytes = round_up(bytes, kHugePage);
    Result<UniqueFd> fd = make_memfd(name, huge_bytes, true);
    if (fd.ok()) {
      Result<std::byte*> base = map_fd(fd->get(), huge_bytes, false, options.populate, false);
      if (base.ok()) {
        Status sealed = seal_memfd(fd->get(), options);
        if (!sealed.ok()) {
          ::munmap(*base, huge_bytes);
          return sealed;
        }
        SharedSegment s;
        s.fd_ = std::move(*fd);
        s.base_ = *base;
        s.bytes_ = huge_bytes;
        s.huge_ = true;
        return s;
      }
    }
  }
  uint64_t page_bytes = round_up(bytes, kSmallPage);
  Result<UniqueFd> fd = make_memfd(name, page_bytes, false);
  if (!fd.ok()) return fd.status();
  Result<std::byte*> base = map_fd(fd->get(), page_bytes, false, options.populate, options.madvise_huge);
  if (!base.ok()) return base.status();
  Status sealed = seal_memfd(fd->get(), options);
  if (!sealed.ok()) {
    ::munmap(*base, page_bytes);
    return sealed;
  }
  SharedSegment s;
  s.fd_ = std::move(*fd);
  s.base_ = *base;
  s.bytes_ = page_bytes;
  return s;
}

Result<SharedSegment> SharedSegment::attach(UniqueFd fd, uint64_t expected_bytes, const MapOptions& options) noexcept {
  if (!fd) return Status(Code::kInvalidArgument, "no segment fd");
  if (expected_bytes == 0) return Status(Code::kProtocol, "segment announced with size 0");
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return Status::from_errno("fstat segment", errno);
  if (!S_ISREG(st.st_mode)) return Status(Code::kProtocol, "segment fd is not a memory file");
  uint64_t file_bytes = static_cast<uint64_t>(st.st_size);
  // A file shorter than announced would SIGBUS on access past its end: refuse it.
  if (file_bytes < expected_bytes) return Status(Code::kProtocol, "segment is shorter than announced");
  // hugetlbfs reports its page size as st_blksize; mappings there must cover whole pages.
  uint64_t unit = st.st_blksize > 0 ? static_cast<uint64_t>(st.st_blksize) : kSmallPage;
  uint64_t map_bytes = round_up(expected_bytes, unit);
  if (map_bytes > file_bytes) map_bytes = expected_bytes;
  Result<std::byte*> base = map_fd(fd.get(), map_bytes, options.read_only, options.populate, options.madvise_huge);
  if (!base.ok()) return base.status();
  SharedSegment s;
  s.fd_ = std::move(fd);
  s.base_ = *base;
  s.bytes_ = map_bytes;
  s.huge_ = unit >= kHugePage;
  return s;
}

Result<UniqueFd> SharedSegment::dup_fd() const noexcept {
  int fd = ::fcntl(fd_.get(), F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return Status::from_errno("dup segment fd", errno);
  return UniqueFd(fd);
}

Result<uint32_t> segment_seals(int fd) noexcept {
  int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0) return Status::from_errno("F_GET_SEALS", errno);
  return static_cast<uint32_t>(seals);
}

}  // namespace kdn::ipc
