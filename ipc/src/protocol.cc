#include <kdn/ipc/protocol.h>

#include <kdn/ipc/payload.h>

#include <bit>

namespace kdn::ipc {
namespace {

constexpr uint64_t round_up_to_page(uint64_t bytes) noexcept {
  return (bytes + kPageBytes - 1) / kPageBytes * kPageBytes;
}

}  // namespace

Result<SessionLayout> SessionLayout::compute(uint32_t ring_entries, uint32_t payload_bytes) noexcept {
  if (!std::has_single_bit(ring_entries) || ring_entries < kMinRingEntries ||
      ring_entries > kMaxRingEntries) {
    return Status(Code::kInvalidArgument, "ring_entries must be a power of two in [16, 4096]");
  }
  if (payload_bytes < kMinPayloadBytes || payload_bytes > kMaxPayloadBytes ||
      payload_bytes % kPageBytes != 0) {
    return Status(Code::kInvalidArgument, "payload_bytes must be a 4 KiB multiple in [4 KiB, 64 MiB]");
  }
  SessionLayout l;
  l.ring_entries = ring_entries;
  l.payload_bytes = payload_bytes;
  l.sq_offset = sizeof(SessionHeader);
  l.cq_offset = l.sq_offset + round_up_to_page(ring_region_bytes(ring_entries, sizeof(Sqe)));
  l.payload_offset = l.cq_offset + round_up_to_page(ring_region_bytes(ring_entries, sizeof(Cqe)));
  l.total_bytes = l.payload_offset + payload_bytes;
  return l;
}

void init_session_header(SessionHeader& h, const SessionLayout& layout, uint64_t session_id) noexcept {
  h.magic = kSessionMagic;
  h.proto_major = kProtocolMajor;
  h.proto_minor = kProtocolMinor;
  h.ring_entries = layout.ring_entries;
  h.payload_bytes = layout.payload_bytes;
  h.session_id = session_id;
  h.segment_bytes = layout.total_bytes;
  h.sq_offset = layout.sq_offset;
  h.cq_offset = layout.cq_offset;
  h.payload_offset = layout.payload_offset;
}

Status check_session_header(const SessionHeader& h, const SessionLayout& layout,
                            uint64_t session_id) noexcept {
  // The daemon wrote these before sending the fd and never changes them; compare them with
  // what the client computed itself instead of trusting them.
  if (h.magic != kSessionMagic || h.proto_major != kProtocolMajor) {
    return Status(Code::kProtocol, "session segment has a bad magic or version");
  }
  bool same = h.ring_entries == layout.ring_entries && h.payload_bytes == layout.payload_bytes &&
              h.session_id == session_id && h.segment_bytes == layout.total_bytes &&
              h.sq_offset == layout.sq_offset && h.cq_offset == layout.cq_offset &&
              h.payload_offset == layout.payload_offset;
  if (!same) return Status(Code::kProtocol, "session segment header disagrees with the welcome");
  return OkStatus();
}

const char* opcode_name(uint8_t opcode) noexcept {
  const OpSpec* spec = op_spec(opcode);
  return spec != nullptr ? spec->name : "unknown";
}

}  // namespace kdn::ipc
