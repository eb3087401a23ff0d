#include <kdn/ipc/protocol.h>

#include <kdn/ipc/payload.h>

#include <bit>
#include <cstring>

namespace kdn::ipc {
namespace {

constexpr uint64_t round_up_to_page(uint64_t bytes) noexcept {
  return (bytes + kPageBytes - 1) / kPageBytes * kPageBytes;
}

}  // namespace

Result<SessionLayout> SessionLayout::compute(uint32_t ring_entries, uint32_t payload_bytes) noexcept {
  if (!std::has_single_bit(ring_entries) || ring_entries < kMinRingEntries || ring_entries > kMaxRingEntries) {
    return Status(Code::kInvalidArgument, "ring_entries must be a power of two in [16, 4096]");
  }
  if (payload_bytes < kMinPayloadBytes || payload_bytes > kMaxPayloadBytes || payload_bytes % kPageBytes != 0) {
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

Status check_session_header(const SessionHeader& h, const SessionLayout& layout, uint64_t session_id) noexcept {
  // The daemon wrote these before sending the fd and never changes them; compare them with
  // what the client computed itself instead of trusting them.
  if (h.magic != kSessionMagic || h.proto_major != kProtocolMajor) {
    return Status(Code::kProtocol, "session segment has a bad magic or version");
  }
  bool same = h.ring_entries == layout.ring_entries && h.payload_bytes == layout.payload_bytes &&
              h.session_id == session_id && h.segment_bytes == layout.total_bytes && h.sq_offset == layout.sq_offset &&
              h.cq_offset == layout.cq_offset && h.payload_offset == layout.payload_offset;
  if (!same) return Status(Code::kProtocol, "session segment header disagrees with the welcome");
  return OkStatus();
}

ModelRecord to_wire(const kdn_model_desc& d) noexcept {
  ModelRecord r{};
  r.num_layers = d.num_layers;
  r.num_kv_heads = d.num_kv_heads;
  r.head_dim = d.head_dim;
  r.dtype = d.dtype;
  r.chunk_tokens = d.chunk_tokens;
  r.rope_style = d.rope_style;
  r.rotary_dim = d.rotary_dim;
  r.rope_scaling = d.rope_scaling;
  r.k_channel_order = d.k_channel_order;
  r.tp_rank = d.tp_rank;
  r.tp_size = d.tp_size;
  r.rope_theta = d.rope_theta;
  std::memcpy(r.rope_scaling_params, d.rope_scaling_params, sizeof r.rope_scaling_params);
  std::memcpy(r.name, d.name, sizeof r.name);
  std::memcpy(r.engine_salt, d.engine_salt, sizeof r.engine_salt);
  return r;
}

kdn_model_desc from_wire(const ModelRecord& r) noexcept {
  kdn_model_desc d{};
  d.struct_size = sizeof d;
  d.num_layers = r.num_layers;
  d.num_kv_heads = r.num_kv_heads;
  d.head_dim = r.head_dim;
  d.dtype = r.dtype;
  d.chunk_tokens = r.chunk_tokens;
  d.rope_style = r.rope_style;
  d.rotary_dim = r.rotary_dim;
  d.rope_scaling = r.rope_scaling;
  d.k_channel_order = r.k_channel_order;
  d.tp_rank = r.tp_rank;
  d.tp_size = r.tp_size;
  d.rope_theta = r.rope_theta;
  std::memcpy(d.rope_scaling_params, r.rope_scaling_params, sizeof d.rope_scaling_params);
  std::memcpy(d.name, r.name, sizeof d.name);
  std::memcpy(d.engine_salt, r.engine_salt, sizeof d.engine_salt);
  return d;
}

}  // namespace kdn::ipc
