// Files kdnd keeps where other users might interfere: a directory is trusted only when no
// other user can write it, and files in it are written whole, by rename, never through a
// link someone planted.
#pragma once

#include <kdn/common/status.h>

#include <sys/types.h>

#include <string>
#include <string_view>

namespace kdn {

// OK if `dir` is a real directory (not a symlink) owned by this process's effective uid or
// root and writable by neither its group nor others; otherwise KDN_ERR_PERMISSION (or the
// stat error) and, in `*error`, a sentence that starts with `what` and `dir` and says what to
// change ("metrics directory /srv/m is writable by every user (mode 1777): ...").
Status check_private_dir(const std::string& dir, const char* what, std::string* error);

// The same rule for a directory kdnd already holds open (`named` starts the sentence:
// "tier.disk.dirs /srv/kdn"). Checking the descriptor, not the path, is what makes the check
// hold: whatever is opened later with openat(fd, ...) lies in the very directory checked,
// even if someone renames a path above it meanwhile.
Status check_private_dir_fd(int fd, const std::string& named, std::string* error);

// Opens `dir` (O_DIRECTORY | O_NOFOLLOW: a symlink there is refused, not followed) and checks
// it by the rule above. Returns the descriptor, which the caller owns and closes.
Result<int> open_private_dir(const std::string& dir, const char* what, std::string* error);

// A file kdnd keeps (a slab file) or reads a secret from: OK if the file open at `fd` is a
// regular file owned by kdnd's effective uid or root, with one link, that neither its group nor
// others may write; otherwise KDN_ERR_PERMISSION and a sentence naming `named` and the fix.
Status check_private_file_fd(int fd, const std::string& named, std::string* error);

// The directory part of `path` ("." for a bare name).
std::string parent_dir(const std::string& path);

// Writes `text` to `path` whole: a temporary beside it, created with O_EXCL | O_NOFOLLOW and
// `mode`, written, then renamed over `path`. `path`'s directory must pass check_private_dir,
// or a user who can write it could redirect the temporary. Errors name the file and errno.
Status write_file_atomically(const std::string& path, std::string_view text, mode_t mode, std::string* error);

}  // namespace kdn
