// UniqueFd: sole owner of one file descriptor, closed on destruction.
//
// Every descriptor the ipc layer creates or receives (sockets, memfds, eventfds, fds that
// arrive by SCM_RIGHTS) is wrapped in a UniqueFd at once, so no early return can leak one
// and no descriptor is closed twice. Not thread-safe; move it between threads if needed.
#pragma once

#include <unistd.h>

#include <utility>

namespace kdn::ipc {

class UniqueFd {
 public:
  constexpr UniqueFd() noexcept = default;
  // Takes ownership of `fd` (-1 means empty).
  constexpr explicit UniqueFd(int fd) noexcept : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) reset(o.release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  constexpr int get() const noexcept { return fd_; }
  constexpr bool valid() const noexcept { return fd_ >= 0; }
  constexpr explicit operator bool() const noexcept { return valid(); }

  // Gives up ownership: the caller now closes the returned descriptor.
  int release() noexcept { return std::exchange(fd_, -1); }

  // Closes the current descriptor (if any) and owns `fd` instead.
  void reset(int fd = -1) noexcept {
    // close() errors are not actionable here: on Linux the descriptor is released anyway.
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

}  // namespace kdn::ipc
