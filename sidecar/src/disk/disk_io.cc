#include "disk/disk_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

namespace kdn::sidecar {
namespace {

int ret(int r) noexcept { return r < 0 ? -errno : r; }

template <class F>
auto retry_eintr(F f) noexcept {
  for (;;) {
    auto r = f();
    if (r >= 0 || errno != EINTR) return r;
  }
}

}  // namespace

int DiskIo::mkdirat(int dir_fd, const std::string& name, mode_t mode) noexcept {
  return ret(::mkdirat(dir_fd, name.c_str(), mode));
}

int DiskIo::openat(int dir_fd, const std::string& name, int flags, mode_t mode) noexcept {
  return ret(retry_eintr([&] { return ::openat(dir_fd, name.c_str(), flags | O_CLOEXEC, mode); }));
}

int DiskIo::file_size(int fd, uint64_t* bytes) noexcept {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return -errno;
  *bytes = uint64_t(st.st_size);
  return 0;
}

int DiskIo::fallocate(int fd, uint64_t offset, uint64_t bytes) noexcept {
  return ret(retry_eintr([&] { return ::fallocate(fd, 0, off_t(offset), off_t(bytes)); }));
}

int DiskIo::truncate(int fd, uint64_t bytes) noexcept { return ret(::ftruncate(fd, off_t(bytes))); }

ssize_t DiskIo::pwrite(int fd, const void* buf, size_t bytes, uint64_t offset) noexcept {
  const ssize_t r = retry_eintr([&] { return ::pwrite(fd, buf, bytes, off_t(offset)); });
  return r < 0 ? -errno : r;
}

ssize_t DiskIo::pread(int fd, void* buf, size_t bytes, uint64_t offset) noexcept {
  const ssize_t r = retry_eintr([&] { return ::pread(fd, buf, bytes, off_t(offset)); });
  return r < 0 ? -errno : r;
}

int DiskIo::fdatasync(int fd) noexcept {
  return ret(retry_eintr([&] { return ::fdatasync(fd); }));
}

DiskIo& DiskIo::system() noexcept {
  static DiskIo io;
  return io;
}

int FaultyDiskIo::mkdirat(int dir_fd, const std::string& name, mode_t mode) noexcept {
  if (!open_fault_.empty() && name.find(open_fault_) != std::string::npos) return -open_errno_;
  return DiskIo::mkdirat(dir_fd, name, mode);
}

int FaultyDiskIo::openat(int dir_fd, const std::string& name, int flags, mode_t mode) noexcept {
  if (!open_fault_.empty() && name.find(open_fault_) != std::string::npos) return -open_errno_;
  return DiskIo::openat(dir_fd, name, flags, mode);
}

int FaultyDiskIo::fallocate(int fd, uint64_t offset, uint64_t bytes) noexcept {
  if (fallocate_errno) return -fallocate_errno;
  return DiskIo::fallocate(fd, offset, bytes);
}

int32_t FaultyDiskIo::completed(IoKind kind, uint32_t device, uint64_t offset, uint32_t bytes, int32_t res) noexcept {
  (void)device, (void)offset;
  for (auto it = faults_.begin(); it != faults_.end(); ++it) {
    if (it->kind != kind || bytes < it->min_bytes) continue;
    int32_t r = it->result;
    if (r >= 0 && res >= 0) r = std::min<int32_t>(r, res);  // a short transfer: never more than done
    if (r >= 0 && uint32_t(r) > bytes) r = int32_t(bytes);
    if (--it->times == 0) faults_.erase(it);
    ++injected_;
    return r;
  }
  return res;
}

}  // namespace kdn::sidecar
