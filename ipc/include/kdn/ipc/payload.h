// Daemon-side checking of submission entries and safe access to the client's payload area.
//
// Everything an Sqe says is untrusted: the client owns the payload area and may rewrite it
// while the daemon works. The rules, enforced here:
//   1. check_sqe() validates the opcode, flags, reserved bits, record counts and both
//      payload references (overflow-safe: off + len is never computed in u32) before
//      anything is read.
//   2. Input bytes are copied into daemon-private memory once (copy_in*) and only that copy
//      is used; the daemon never reads the same shared byte twice.
//   3. Output bytes are written with bounds-checked copy_out*; nothing else is written.
// A failed check is answered with an error CQE; the session stays open.
#pragma once

#include <kdn/common/status.h>
#include <kdn/ipc/ops.h>
#include <kdn/ipc/protocol.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

namespace kdn::ipc {

// True iff [off, off + len) lies inside [0, area_bytes). Never overflows.
constexpr bool payload_ref_ok(uint32_t off, uint32_t len, uint32_t area_bytes) noexcept {
  return off <= area_bytes && len <= area_bytes - off;
}
// The same for 64-bit ranges (arena offsets received by the client).
constexpr bool range_ok(uint64_t off, uint64_t len, uint64_t size) noexcept { return off <= size && len <= size - off; }

// A checked Sqe: its shape and record counts.
struct SqeShape {
  const OpShape* shape;
  uint32_t in_records;    // records in the input
  uint32_t out_capacity;  // records that fit in the output (capped at kMaxKeysPerOp)
};

// Validates an SQE against a payload area of `payload_bytes`. Errors (the CQE status):
//   KDN_ERR_UNSUPPORTED       unknown opcode (a newer client; the session stays usable)
//   KDN_ERR_PERMISSION        admin opcode on a session without kHelloFlagAdmin
//   KDN_ERR_PROTOCOL          nonzero reserved/unknown flags, a reference outside the area,
//                             a length that is not a whole number of records, or payload
//                             on an opcode that takes none
//   KDN_ERR_INVALID_ARGUMENT  more than kMaxKeysPerOp records, zero records where at least
//                             one is needed, or an output too small for the input
Result<SqeShape> check_sqe(const Sqe& sqe, uint32_t payload_bytes, bool admin_session) noexcept;

// A view of the client-owned payload area as the daemon maps it. Copyable, non-owning.
class PayloadArea {
 public:
  PayloadArea() noexcept = default;
  PayloadArea(std::byte* base, uint32_t bytes) noexcept : base_(base), bytes_(bytes) {}

  uint32_t size() const noexcept { return bytes_; }

  // Copies payload[off, off + dst.size()) into dst; KDN_ERR_PROTOCOL if out of bounds.
  Status copy_in(uint32_t off, std::span<std::byte> dst) const noexcept;
  // Copies src into payload[off, off + src.size()); KDN_ERR_PROTOCOL if out of bounds.
  Status copy_out(uint32_t off, std::span<const std::byte> src) const noexcept;
  // Zeroes payload[off, off + len); KDN_ERR_PROTOCOL if out of bounds.
  Status zero(uint32_t off, uint32_t len) const noexcept;

  // Copies the SQE's input records into `scratch` (daemon memory) and returns the filled
  // prefix. KDN_ERR_PROTOCOL if the input is not whole T records inside the area,
  // KDN_ERR_INVALID_ARGUMENT if scratch is too small.
  template <class T>
  Result<std::span<T>> copy_in_records(const Sqe& sqe, std::span<T> scratch) const noexcept {
    static_assert(std::is_trivially_copyable_v<T>);
    if (sqe.in_len % sizeof(T) != 0) return Status(Code::kProtocol, "input is not whole records");
    size_t n = sqe.in_len / sizeof(T);
    if (n > scratch.size()) return Status(Code::kInvalidArgument, "too many input records");
    std::span<T> filled = scratch.first(n);
    KDN_RETURN_IF_ERROR(copy_in(sqe.in_off, std::as_writable_bytes(filled)));
    return filled;
  }

  // Copies input records [first, first + dst.size()) into dst, for a request served in
  // slices: each record is still read exactly once. KDN_ERR_PROTOCOL if they are not inside
  // the SQE's input.
  template <class T>
  Status copy_in_slice(const Sqe& sqe, uint32_t first, std::span<T> dst) const noexcept {
    static_assert(std::is_trivially_copyable_v<T>);
    const uint64_t begin = uint64_t(first) * sizeof(T), bytes = dst.size_bytes();
    if (begin > sqe.in_len || bytes > sqe.in_len - begin)
      return Status(Code::kProtocol, "input slice outside the input");
    return copy_in(sqe.in_off + uint32_t(begin), std::as_writable_bytes(dst));
  }

  // Writes `records` at the start of the SQE's output; KDN_ERR_INVALID_ARGUMENT if they do
  // not fit in out_len, KDN_ERR_PROTOCOL if the output lies outside the area.
  template <class T>
  Status copy_out_records(const Sqe& sqe, std::span<const T> records) const noexcept {
    return copy_out_slice(sqe, 0, records);
  }
  // Writes `records` as output records [first, first + records.size()).
  template <class T>
  Status copy_out_slice(const Sqe& sqe, uint32_t first, std::span<const T> records) const noexcept {
    static_assert(std::is_trivially_copyable_v<T>);
    const uint64_t begin = uint64_t(first) * sizeof(T);
    if (begin > sqe.out_len || records.size_bytes() > sqe.out_len - begin)
      return Status(Code::kInvalidArgument, "output too small");
    return copy_out(sqe.out_off + uint32_t(begin), std::as_bytes(records));
  }
  // Zeroes output records [first, last) of T: the records of a request that were not served.
  template <class T>
  Status zero_out_records(const Sqe& sqe, uint32_t first, uint32_t last) const noexcept {
    const uint64_t begin = uint64_t(first) * sizeof(T), end = uint64_t(last) * sizeof(T);
    if (first >= last) return OkStatus();
    if (end > sqe.out_len) return Status(Code::kInvalidArgument, "output too small");
    return zero(sqe.out_off + uint32_t(begin), uint32_t(end - begin));
  }

 private:
  std::byte* base_ = nullptr;
  uint32_t bytes_ = 0;
};

}  // namespace kdn::ipc
