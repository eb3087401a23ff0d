#include <kdn/ipc/payload.h>

#include <array>

namespace kdn::ipc {
namespace {

struct OpEntry {
  OpShape shape;
  OpTraits traits;
  const char* name = nullptr;                                     // null: no op has this number
  uint32_t (*wanted)(const Sqe&, uint32_t in_records) = nullptr;  // output records needed
};

using OpTable = std::array<OpEntry, kMaxOpcode>;

// Indexed by opcode - 1; built from AllOps (ops.h), so shapes and traits live in one place.
// Each op lands at its own number, so features that number their ops apart leave gaps.
template <class... Ops>
constexpr OpTable make_table(OpList<Ops...>) noexcept {
  OpTable t{};
  ((t[size_t(Ops::kOpcode) - 1] = OpEntry{Ops::kShape, traits_of<Ops>(), Ops::kName, &records_wanted<Ops>}), ...);
  return t;
}

constexpr OpTable kOps = make_table(AllOps{});
static_assert(PingOp::kOpcode == Opcode(1) && GpuPrefetchOp::kOpcode == Opcode(kMaxOpcode) && kMaxOpcode == 28);
static_assert(GpuCheckOp::kOpcode == Opcode(27));
static_assert(GpuSegmentRetrieveOp::kOpcode == Opcode(26));
static_assert(GpuInfoOp::kOpcode == Opcode(25));
static_assert(MetricsOp::kOpcode == Opcode(20) && GpuRegisterOp::kOpcode == Opcode(21) &&
              GpuStoreOp::kOpcode == Opcode(24));
static_assert(LeaseOp::kOpcode == Opcode(7) && StatsOp::kOpcode == Opcode(9) && EvictOp::kOpcode == Opcode(11));
static_assert(LookupEachOp::kOpcode == Opcode(12) && LeaseEachOp::kOpcode == Opcode(13));
static_assert(PrefetchOp::kOpcode == Opcode(16) && GpuBlendSelectOp::kOpcode == Opcode(14));

const OpEntry* entry_of(uint8_t opcode) noexcept {
  if (opcode == 0 || opcode > kMaxOpcode || kOps[opcode - 1].name == nullptr) return nullptr;
  return &kOps[opcode - 1];
}

Status check_header_fields(const Sqe& sqe) noexcept {
  if ((sqe.flags & ~kSqeKnownFlags) != 0) return Status(Code::kProtocol, "unknown SQE flags");
  if (sqe.reserved != 0) return Status(Code::kProtocol, "SQE reserved field is not zero");
  return OkStatus();
}

// Counts the input records; fills shape.in_records.
Status check_input(const Sqe& sqe, const OpShape& op, uint32_t area, SqeShape& shape) noexcept {
  if (op.in_record == 0) {
    if (sqe.in_len != 0) return Status(Code::kProtocol, "opcode takes no input");
    return OkStatus();
  }
  if (!payload_ref_ok(sqe.in_off, sqe.in_len, area)) {
    return Status(Code::kProtocol, "input reference outside the payload area");
  }
  if (sqe.in_len % op.in_record != 0) return Status(Code::kProtocol, "input is not whole records");
  uint32_t n = sqe.in_len / op.in_record;
  if (op.in_single && n != 1) return Status(Code::kProtocol, "opcode takes exactly one input record");
  if (n > kMaxKeysPerOp) return Status(Code::kInvalidArgument, "more than 65536 records in one op");
  shape.in_records = n;
  return OkStatus();
}

// Records the output must be able to hold.
uint32_t required_output(const Sqe& sqe, const OpShape& op, uint32_t in_records) noexcept {
  switch (op.out) {
    case OpShape::Out::kNone:
      return 0;
    case OpShape::Out::kAtLeastOne:
      return 1;
    case OpShape::Out::kPerInput:
      return entry_of(sqe.opcode)->wanted(sqe, in_records);
  }
  return 0;
}

// Counts the output capacity; fills shape.out_capacity.
Status check_output(const Sqe& sqe, const OpShape& op, uint32_t area, SqeShape& shape) noexcept {
  if (op.out_record == 0) {
    if (sqe.out_len != 0) return Status(Code::kProtocol, "opcode takes no output");
    return OkStatus();
  }
  if (!payload_ref_ok(sqe.out_off, sqe.out_len, area)) {
    return Status(Code::kProtocol, "output reference outside the payload area");
  }
  uint32_t cap = sqe.out_len / op.out_record;
  if (cap < required_output(sqe, op, shape.in_records)) {
    return Status(Code::kInvalidArgument, "output too small for the request");
  }
  shape.out_capacity = cap < kMaxKeysPerOp ? cap : kMaxKeysPerOp;
  return OkStatus();
}

Status check_evict_mode(const Sqe& sqe, const SqeShape& shape) noexcept {
  if (sqe.arg[0] == static_cast<uint64_t>(EvictMode::kAll)) {
    if (shape.in_records != 0) return Status(Code::kInvalidArgument, "EVICT all takes no keys");
    return OkStatus();
  }
  if (sqe.arg[0] == static_cast<uint64_t>(EvictMode::kByKeys)) return OkStatus();
  if (sqe.arg[0] == static_cast<uint64_t>(EvictMode::kHost)) {
    if (shape.in_records != 0) return Status(Code::kInvalidArgument, "EVICT host takes no keys");
    return OkStatus();
  }
  return Status(Code::kInvalidArgument, "unknown EVICT mode");
}

}  // namespace

const OpShape* op_shape(uint8_t opcode) noexcept {
  const OpEntry* e = entry_of(opcode);
  return e ? &e->shape : nullptr;
}

const OpTraits* op_traits(uint8_t opcode) noexcept {
  const OpEntry* e = entry_of(opcode);
  return e ? &e->traits : nullptr;
}

const char* opcode_name(uint8_t opcode) noexcept {
  const OpEntry* e = entry_of(opcode);
  return e ? e->name : "unknown";
}

Result<SqeShape> check_sqe(const Sqe& sqe, uint32_t payload_bytes, bool admin_session) noexcept {
  const OpShape* op = op_shape(sqe.opcode);
  if (op == nullptr) return Status(Code::kUnsupported, "unknown opcode");
  KDN_RETURN_IF_ERROR(check_header_fields(sqe));
  if (op->admin && !admin_session) return Status(Code::kPermission, "admin opcode on a session not granted admin");
  SqeShape shape{op, 0, 0};
  KDN_RETURN_IF_ERROR(check_input(sqe, *op, payload_bytes, shape));
  KDN_RETURN_IF_ERROR(check_output(sqe, *op, payload_bytes, shape));
  if (sqe.opcode == uint8_t(Opcode::kEvict)) KDN_RETURN_IF_ERROR(check_evict_mode(sqe, shape));
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

Status PayloadArea::zero(uint32_t off, uint32_t len) const noexcept {
  if (!payload_ref_ok(off, len, bytes_)) return Status(Code::kProtocol, "payload write outside the area");
  if (len) std::memset(base_ + off, 0, len);
  return OkStatus();
}

}  // namespace kdn::ipc
