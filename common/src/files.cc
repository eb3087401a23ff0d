#include <kdn/common/files.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace kdn {
namespace {

Status fail(std::string* error, Status st, const std::string& sentence) {
  if (error) {
    *error = sentence;
    if (st.sys_errno()) *error += std::string(": ") + std::strerror(st.sys_errno());
  }
  return st;
}

std::string octal_mode(mode_t m) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%04o", unsigned(m & 07777));
  return buf;
}

}  // namespace

std::string parent_dir(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

Status check_private_dir(const std::string& dir, const char* what, std::string* error) {
  struct stat st;
  const std::string named = std::string(what) + " " + dir;
  if (::lstat(dir.c_str(), &st) != 0) {
    const int err = errno;
    return fail(error, Status::from_errno("stat directory", err), "stat " + named);
  }
  if (S_ISLNK(st.st_mode))
    return fail(error, Status(Code::kPermission, "directory is a symlink"),
                named + " is a symlink; name the real directory");
  if (!S_ISDIR(st.st_mode))
    return fail(error, Status(Code::kInvalidArgument, "not a directory"), named + " is not a directory");
  if (st.st_uid != ::geteuid() && st.st_uid != 0)
    return fail(error, Status(Code::kPermission, "directory belongs to another user"),
                named + " belongs to uid " + std::to_string(st.st_uid) + ", not to kdnd's uid " +
                    std::to_string(::geteuid()) + " or root");
  if (st.st_mode & (S_IWGRP | S_IWOTH))
    return fail(error, Status(Code::kPermission, "directory is writable by others"),
                named + " is writable by " + ((st.st_mode & S_IWOTH) ? "every user" : "its group") +
                    " (mode " + octal_mode(st.st_mode) +
                    "): another user could replace what kdnd keeps there; use a directory only "
                    "kdnd's user can write");
  return OkStatus();
}

Status write_file_atomically(const std::string& path, std::string_view text, mode_t mode,
                             std::string* error) {
  const std::string tmp = parent_dir(path) + "/." +
                          path.substr(path.rfind('/') == std::string::npos ? 0 : path.rfind('/') + 1) +
                          ".tmp";
  (void)::unlink(tmp.c_str());  // a temporary a crash left behind (the directory is ours alone)
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
  if (fd < 0) {
    const int err = errno;
    return fail(error, Status::from_errno("create temporary file", err), "create " + tmp);
  }
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      ::close(fd);
      (void)::unlink(tmp.c_str());
      return fail(error, Status::from_errno("write temporary file", err), "write " + tmp);
    }
    done += size_t(n);
  }
  (void)::fchmod(fd, mode);  // open applied the umask
  if (::close(fd) != 0) {
    const int err = errno;
    (void)::unlink(tmp.c_str());
    return fail(error, Status::from_errno("close temporary file", err), "close " + tmp);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    (void)::unlink(tmp.c_str());
    return fail(error, Status::from_errno("rename file", err), "rename " + tmp + " to " + path);
  }
  return OkStatus();
}

}  // namespace kdn
