#include <kdn/ipc/payload.h>

#include <array>

namespace kdn::ipc {
namespace {

constexpr uint32_t kKey = sizeof(kdn_key);
constexpr uint32_t kId = sizeof(uint64_t);

//                 opcode                  name              in  single  out  single per-in admin
constexpr std::array<OpSpec, kMaxOpcode> kOpSpecs = {{
    {Opcode::kPing, "PING", 0, false, 0, false, false, false},
    {Opcode::kRegisterModel, "REGISTER_MODEL", sizeof(kdn_model_desc), true, 0, false, false, false},
    {Opcode::kLookup, "LOOKUP", kKey, false, 0, false, false, false},
    {Opcode::kReserve, "RESERVE", kKey, false, sizeof(ReserveSlot), false, true, false},
    {Opcode::kCommit, "COMMIT", kId, false, 0, false, false, false},
    {Opcode::kAbort, "ABORT", kId, false, 0, false, false, false},
    {Opcode::kLease, "LEASE", kKey, false, sizeof(LeaseSlot), false, true, false},
    {Opcode::kRelease, "RELEASE", kId, false, 0, false, false, false},
    {Opcode::kStats, "STATS", 0, false, sizeof(kdn_stats), true, false, false},
    {Opcode::kList, "LIST", 0, false, sizeof(ListEntry), false, false, true},
    {Opcode::kEvict, "EVICT", kKey, false, 0, false, false, true},
}};

Status check_header_fields(const Sqe& sqe) noexcept {
  if ((sqe.flags & ~kSqeKnownFlags) != 0) return Status(Code::kProtocol, "unknown SQE flags");
  if (sqe.reserved != 0) return Status(Code::kProtocol, "SQE reserved field is not zero");
  return OkStatus();
}

// Counts the input records; fills shape.in_records.
Status check_input(const Sqe& sqe, const OpSpec& spec, uint32_t area, SqeShape& shape) noexcept {
  if (spec.in_record == 0) {
    if (sqe.in_len != 0) return Status(Code::kProtocol, "opcode takes no input");
    return OkStatus();
  }
  if (!payload_ref_ok(sqe.in_off, sqe.in_len, area)) {
    return Status(Code::kProtocol, "input reference outside the payload area");
  }
  if (sqe.in_len % spec.in_record != 0) return Status(Code::kProtocol, "input is not whole records");
  uint32_t n = sqe.in_len / spec.in_record;
  if (spec.in_single && n != 1) return Status(Code::kProtocol, "opcode takes exactly one input record");
  if (n > kMaxKeysPerOp) return Status(Code::kInvalidArgument, "more than 65536 records in one op");
  shape.in_records = n;
  return OkStatus();
}

// Records the output must be able to hold.
uint32_t required_output(const Sqe& sqe, const OpSpec& spec, uint32_t in_records) noexcept {
  if (spec.out_single) return 1;
  if (!spec.out_per_input) return spec.opcode == Opcode::kList ? 1 : 0;
  uint64_t limit = sqe.arg[0];  // LEASE: at most arg0 chunks (0 = no limit)
  if (spec.opcode == Opcode::kLease && limit != 0 && limit < in_records) {
    return static_cast<uint32_t>(limit);
  }
  return in_records;
}

// Counts the output capacity; fills shape.out_capacity.
Status check_output(const Sqe& sqe, const OpSpec& spec, uint32_t area, SqeShape& shape) noexcept {
  if (spec.out_record == 0) {
    if (sqe.out_len != 0) return Status(Code::kProtocol, "opcode takes no output");
    return OkStatus();
  }
  if (!payload_ref_ok(sqe.out_off, sqe.out_len, area)) {
    return Status(Code::kProtocol, "output reference outside the payload area");
  }
  uint32_t cap = sqe.out_len / spec.out_record;
  if (cap < required_output(sqe, spec, shape.in_records)) {
    return Status(Code::kInvalidArgument, "output too small for the request");
  }
  if (spec.out_single) cap = 1;
  shape.out_capacity = cap < kMaxKeysPerOp ? cap : kMaxKeysPerOp;
  return OkStatus();
}

Status check_evict_mode(const Sqe& sqe, const SqeShape& shape) noexcept {
  if (sqe.arg[0] == static_cast<uint64_t>(EvictMode::kAll)) {
    if (shape.in_records != 0) return Status(Code::kInvalidArgument, "EVICT all takes no keys");
    return OkStatus();
  }
  if (sqe.arg[0] == static_cast<uint64_t>(EvictMode::kByKeys)) return OkStatus();
  return Status(Code::kInvalidArgument, "unknown EVICT mode");
}

}  // namespace

const OpSpec* op_spec(uint8_t opcode) noexcept {
  if (opcode == 0 || opcode > kMaxOpcode) return nullptr;
  return &kOpSpecs[opcode - 1];
}

Result<SqeShape> check_sqe(const Sqe& sqe, uint32_t payload_bytes, bool admin_session) noexcept {
  const OpSpec* spec = op_spec(sqe.opcode);
  if (spec == nullptr) return Status(Code::kUnsupported, "unknown opcode");
  KDN_RETURN_IF_ERROR(check_header_fields(sqe));
  if (spec->admin && !admin_session) return Status(Code::kPermission, "admin opcode on a non-admin session");
  SqeShape shape{spec, 0, 0};
  KDN_RETURN_IF_ERROR(check_input(sqe, *spec, payload_bytes, shape));
  KDN_RETURN_IF_ERROR(check_output(sqe, *spec, payload_bytes, shape));
  if (spec->opcode == Opcode::kEvict) KDN_RETURN_IF_ERROR(check_evict_mode(sqe, shape));
  return shape;
}

Status PayloadArea::copy_in(uint32_t off, std::span<std::byte> dst) const noexcept {
  if (dst.size() > bytes_ || !payload_ref_ok(off, static_cast<uint32_t>(dst.size()), bytes_)) {
    return Status(Code::kProtocol, "payload read outside the area");
  }
  // The client may be rewriting these bytes right now; this copy is the only read of them.
  if (!dst.empty()) std::memcpy(dst.data(), base_ + off, dst.size());
  return OkStatus();
}

Status PayloadArea::copy_out(uint32_t off, std::span<const std::byte> src) const noexcept {
  if (src.size() > bytes_ || !payload_ref_ok(off, static_cast<uint32_t>(src.size()), bytes_)) {
    return Status(Code::kProtocol, "payload write outside the area");
  }
  if (!src.empty()) std::memcpy(base_ + off, src.data(), src.size());
  return OkStatus();
}

}  // namespace kdn::ipc
