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

namespace {

// Owner and mode of something kdnd keeps: ours or root's, writable by nobody else.
Status check_owner_and_mode(const struct stat& st, const std::string& named, const char* other_hint,
                            std::string* error) {
  if (st.st_uid != ::geteuid() && st.st_uid != 0)
    return fail(error, Status(Code::kPermission, "belongs to another user"),
                named + " belongs to uid " + std::to_string(st.st_uid) + ", not to kdnd's uid " +
                    std::to_string(::geteuid()) + " or root");
  if (st.st_mode & (S_IWGRP | S_IWOTH))
    return fail(error, Status(Code::kPermission, "writable by others"),
                named + " is writable by " + ((st.st_mode & S_IWOTH) ? "every user" : "its group") + " (mode " +
                    octal_mode(st.st_mode) + "): " + other_hint);
  return OkStatus();
}

constexpr const char* kDirHint =
    "another user could replace what kdnd keeps there; use a directory only kdnd's user can write";

}  // namespace

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
  return check_owner_and_mode(st, named, kDirHint, error);
}

Status check_private_dir_fd(int fd, const std::string& named, std::string* error) {
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    return fail(error, Status::from_errno("stat directory", err), "stat " + named);
  }
  if (!S_ISDIR(st.st_mode))
    return fail(error, Status(Code::kInvalidArgument, "not a directory"), named + " is not a directory");
  return check_owner_and_mode(st, named, kDirHint, error);
}

Result<int> open_private_dir(const std::string& dir, const char* what, std::string* error) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    // O_NOFOLLOW answers a symlink with ELOOP (or ENOTDIR beside O_DIRECTORY): lstat says which.
    if (err == ELOOP || err == ENOTDIR) {
      Status why = check_private_dir(dir, what, error);
      if (!why.ok()) return why;
    }
    return fail(error, Status::from_errno("open directory", err), std::string("open ") + what + " " + dir);
  }
  Status st = check_private_dir_fd(fd, std::string(what) + " " + dir, error);
  if (!st.ok()) {
    ::close(fd);
    return st;
  }
  return fd;
}

Status check_private_file_fd(int fd, const std::string& named, std::string* error) {
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    return fail(error, Status::from_errno("stat file", err), "stat " + named);
  }
  if (!S_ISREG(st.st_mode))
    return fail(error, Status(Code::kInvalidArgument, "not a regular file"), named + " is not a regular file");
  if (st.st_nlink != 1)
    return fail(error, Status(Code::kPermission, "file has other links"),
                named + " has " + std::to_string(st.st_nlink) +
                    " links: another name for it could be written by someone else; keep one link");
  return check_owner_and_mode(st, named, "another user could rewrite it; chmod go-w the file", error);
}

Status write_file_atomically(const std::string& path, std::string_view text, mode_t mode, std::string* error) {
  const std::string tmp =
      parent_dir(path) + "/." + path.substr(path.rfind('/') == std::string::npos ? 0 : path.rfind('/') + 1) + ".tmp";
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
