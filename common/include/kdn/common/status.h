// Status and Result: kdn's error values. No exceptions cross a module boundary; every
// fallible function returns one of these. Success never allocates: a Status is a code plus
// a pointer to a static string.
//
// Codes are the public kdn_status values (kdn/kdn.h), so a Status crosses the C ABI and the
// wire protocol unchanged.
#pragma once

#include <kdn/kdn.h>

#include <cstdint>
#include <new>
#include <type_traits>
#include <utility>

namespace kdn {

enum class Code : int32_t {
  kOk = KDN_OK,
  kInvalidArgument = KDN_ERR_INVALID_ARGUMENT,
  kNotFound = KDN_ERR_NOT_FOUND,
  kNoSpace = KDN_ERR_NO_SPACE,
  kProtocol = KDN_ERR_PROTOCOL,
  kVersion = KDN_ERR_VERSION,
  kPermission = KDN_ERR_PERMISSION,
  kUnavailable = KDN_ERR_UNAVAILABLE,
  kTimeout = KDN_ERR_TIMEOUT,
  kInProgress = KDN_ERR_IN_PROGRESS,
  kBusy = KDN_ERR_BUSY,
  kIo = KDN_ERR_IO,
  kNoMemory = KDN_ERR_NO_MEMORY,
  kCorrupt = KDN_ERR_CORRUPT,
  kModelMismatch = KDN_ERR_MODEL_MISMATCH,
  kUnsupported = KDN_ERR_UNSUPPORTED,
  kInternal = KDN_ERR_INTERNAL,
  kLimit = KDN_ERR_LIMIT,
};

// Name of a code (never null).
const char* code_name(Code c) noexcept;

class [[nodiscard]] Status {
 public:
  constexpr Status() noexcept = default;
  // `what` must be a string literal or otherwise outlive every copy of the Status.
  constexpr Status(Code code, const char* what) noexcept : code_(code), what_(what) {}
  // An OS failure: keeps errno for the message.
  static Status from_errno(const char* what, int err) noexcept {
    Status s(Code::kIo, what);
    s.errno_ = err;
    return s;
  }

  constexpr bool ok() const noexcept { return code_ == Code::kOk; }
  constexpr Code code() const noexcept { return code_; }
  constexpr int32_t raw() const noexcept { return static_cast<int32_t>(code_); }
  constexpr const char* what() const noexcept { return what_ ? what_ : code_name_constexpr(code_); }
  constexpr int sys_errno() const noexcept { return errno_; }

 private:
  static constexpr const char* code_name_constexpr(Code c) noexcept { return c == Code::kOk ? "ok" : "error"; }
  Code code_ = Code::kOk;
  const char* what_ = nullptr;
  int errno_ = 0;
};

constexpr Status OkStatus() noexcept { return Status(); }

// Result<T>: a T or a non-ok Status. T must be nothrow-movable.
template <class T>
class [[nodiscard]] Result {
  static_assert(std::is_nothrow_move_constructible_v<T>);

 public:
  Result(T value) noexcept : has_(true) { new (&storage_) T(std::move(value)); }  // NOLINT
  Result(Status status) noexcept : status_(status) {}                             // NOLINT
  Result(Result&& o) noexcept : status_(o.status_), has_(o.has_) {
    if (has_) new (&storage_) T(std::move(*o.ptr()));
  }
  Result& operator=(Result&& o) noexcept {
    if (this != &o) {
      reset();
      status_ = o.status_;
      has_ = o.has_;
      if (has_) new (&storage_) T(std::move(*o.ptr()));
    }
    return *this;
  }
  Result(const Result&) = delete;
  Result& operator=(const Result&) = delete;
  ~Result() { reset(); }

  bool ok() const noexcept { return has_; }
  const Status& status() const noexcept { return status_; }
  T& value() & noexcept { return *ptr(); }
  const T& value() const& noexcept { return *ptr(); }
  T&& value() && noexcept { return std::move(*ptr()); }
  T* operator->() noexcept { return ptr(); }
  const T* operator->() const noexcept { return ptr(); }
  T& operator*() noexcept { return *ptr(); }

 private:
  T* ptr() noexcept { return std::launder(reinterpret_cast<T*>(&storage_)); }
  const T* ptr() const noexcept { return std::launder(reinterpret_cast<const T*>(&storage_)); }
  void reset() noexcept {
    if (has_) ptr()->~T();
    has_ = false;
  }
  alignas(T) unsigned char storage_[sizeof(T)];
  Status status_;
  bool has_ = false;
};

}  // namespace kdn

// Returns the Status of `expr` from the enclosing function if it is not ok.
#define KDN_RETURN_IF_ERROR(expr)      \
  do {                                 \
    ::kdn::Status kdn_st_ = (expr);    \
    if (!kdn_st_.ok()) return kdn_st_; \
  } while (0)
