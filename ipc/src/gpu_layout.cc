// The wire form of an engine layout (kdn/ipc/gpu_layout.h).
#include <kdn/ipc/gpu_layout.h>

#include <cstring>
#include <new>

namespace kdn::ipc {

uint64_t gpu_layout_wire_bytes(uint32_t layers, bool split_v, uint64_t tokens) noexcept {
  return sizeof(GpuLayoutRecord) + uint64_t(layers) * 8 * (split_v ? 2 : 1) + tokens * 8;
}

Result<std::vector<std::byte>> encode_gpu_layout(const kdn_engine_layout& abi, uint32_t layers,
                                                 std::span<const int64_t> slots) noexcept {
  if (abi.layer_base == nullptr || layers == 0) return Status(Code::kInvalidArgument, "layout: null layer_base");
  if (slots.size() > UINT32_MAX) return Status(Code::kInvalidArgument, "layout: too many tokens");
  const bool split = abi.v_layer_base != nullptr;
  try {
    std::vector<std::byte> out(gpu_layout_wire_bytes(layers, split, slots.size()));
    GpuLayoutRecord r{};
    r.engine_dtype = abi.engine_dtype;
    r.flags = split ? kGpuLayoutSplitV : 0;
    r.layers = layers;
    r.tokens = uint32_t(slots.size());
    r.stride_kv = abi.stride_kv;
    r.stride_block = abi.stride_block;
    r.stride_offset = abi.stride_offset;
    r.stride_head = abi.stride_head;
    r.stride_dim = abi.stride_dim;
    r.block_size = abi.block_size;
    r.v_stride_block = abi.v_stride_block;
    r.v_stride_offset = abi.v_stride_offset;
    r.v_stride_head = abi.v_stride_head;
    r.v_stride_dim = abi.v_stride_dim;
    std::byte* p = out.data();
    std::memcpy(p, &r, sizeof r);
    p += sizeof r;
    for (uint32_t l = 0; l < layers; ++l, p += 8) {
      const uint64_t a = uintptr_t(abi.layer_base[l]);
      std::memcpy(p, &a, 8);
    }
    for (uint32_t l = 0; split && l < layers; ++l, p += 8) {
      const uint64_t a = uintptr_t(abi.v_layer_base[l]);
      std::memcpy(p, &a, 8);
    }
    if (!slots.empty()) std::memcpy(p, slots.data(), slots.size() * 8);
    return out;
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoMemory, "layout: out of memory");
  }
}

Result<GpuLayout> decode_gpu_layout(std::span<const std::byte> bytes) noexcept {
  auto invalid = [](const char* what) { return Status(Code::kInvalidArgument, what); };
  if (bytes.size() < sizeof(GpuLayoutRecord)) return invalid("GPU layout: shorter than its record");
  try {
    GpuLayout l;
    std::memcpy(&l.record, bytes.data(), sizeof l.record);
    const GpuLayoutRecord& r = l.record;
    if (r.flags & ~kGpuLayoutSplitV) return invalid("GPU layout: unknown flags");
    if (r.layers == 0 || r.layers > 4096) return invalid("GPU layout: layers out of range");
    const bool split = r.flags & kGpuLayoutSplitV;
    if (gpu_layout_wire_bytes(r.layers, split, r.tokens) != bytes.size())
      return invalid("GPU layout: length does not match layers and tokens");
    const std::byte* p = bytes.data() + sizeof r;
    l.k_bases.resize(r.layers);
    std::memcpy(l.k_bases.data(), p, r.layers * 8ull);
    p += r.layers * 8ull;
    if (split) {
      l.v_bases.resize(r.layers);
      std::memcpy(l.v_bases.data(), p, r.layers * 8ull);
      p += r.layers * 8ull;
    }
    l.slots.resize(r.tokens);
    std::memcpy(l.slots.data(), p, r.tokens * 8ull);
    return l;
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoMemory, "GPU layout: out of memory");
  }
}

}  // namespace kdn::ipc
