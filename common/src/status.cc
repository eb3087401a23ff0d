#include <kdn/common/status.h>

namespace kdn {

const char* code_name(Code c) noexcept {
  switch (static_cast<int>(c)) {
    case KDN_OK:
      return "ok";
    case KDN_ERR_INVALID_ARGUMENT:
      return "invalid argument";
    case KDN_ERR_NOT_FOUND:
      return "not found";
    case KDN_ERR_NO_SPACE:
      return "no space: the tier is full of leased or reserved chunks";
    case KDN_ERR_PROTOCOL:
      return "protocol error: malformed message or ring entry";
    case KDN_ERR_VERSION:
      return "protocol or ABI version mismatch";
    case KDN_ERR_PERMISSION:
      return "permission denied";
    case KDN_ERR_UNAVAILABLE:
      return "kdnd unavailable or connection closed";
    case KDN_ERR_TIMEOUT:
      return "timed out";
    case KDN_ERR_IN_PROGRESS:
      return "operation in progress";
    case KDN_ERR_BUSY:
      return "too many operations in flight";
    case KDN_ERR_IO:
      return "I/O or system call failure";
    case KDN_ERR_NO_MEMORY:
      return "out of memory";
    case KDN_ERR_CORRUPT:
      return "data failed an integrity check";
    case KDN_ERR_MODEL_MISMATCH:
      return "model or layout mismatch";
    case KDN_ERR_UNSUPPORTED:
      return "unsupported";
    case KDN_ERR_INTERNAL:
      return "internal error";
    case KDN_ERR_LIMIT:
      return "a configured limit would be exceeded";
    default:
      return "unknown kdn status";
  }
}

}  // namespace kdn
