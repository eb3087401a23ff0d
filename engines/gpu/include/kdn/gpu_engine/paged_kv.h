// The paged KV cache kdn-gpu-engine allocates, and the byte pattern it writes and checks.
//
// Geometry (vLLM's flash-attention layout, NHD): per layer one tensor
//     [2 (K, V)][num_blocks][block_size][kv_heads][head_dim]
// of 16-bit elements, every layer's tensor back to back in ONE device allocation, between two
// guard areas that nothing may write:
//     [guard][layer 0][layer 1]...[layer L-1][guard + the allocation's rounding]
// A token sequence lives in the blocks its block table names: token t sits in slot
// table[t / block_size] * block_size + t % block_size.
//
// Pattern. Element (layer, plane, token, head, dim) of a stored sequence is kv_pattern(seed, ...):
// a finite, normal fp16 value (never NaN or Inf, so no conversion may canonicalize it), a hash
// of all six. A slot no token owns holds canary(seed, ..., slot, ...) instead, so a retrieve that
// writes a wrong block, or no block, is caught as surely as a wrong byte. Guard bytes hold
// guard_byte(offset).
//
// Everything here is host code (and KDN_HD bodies the CUDA kernels run too); no CUDA types.
// Thread safety: pure functions and value types.
#pragma once

#include <kdn/kdn.h>
#include <kdn/kernels/hd.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kdn::gpu_engine {

constexpr uint64_t kGuardBytes = 64 << 10;  // before and after the KV tensors
constexpr uint32_t kElementBytes = 2;       // fp16 / bf16

struct PagedKvShape {
  uint32_t layers = 0;
  uint32_t kv_heads = 0;
  uint32_t head_dim = 0;
  uint32_t block_size = 16;
  uint32_t num_blocks = 0;

  KDN_HD uint64_t token_elems() const noexcept { return uint64_t(kv_heads) * head_dim; }
  KDN_HD uint64_t block_elems() const noexcept { return block_size * token_elems(); }
  KDN_HD uint64_t plane_elems() const noexcept { return num_blocks * block_elems(); }
  KDN_HD uint64_t layer_elems() const noexcept { return 2 * plane_elems(); }
  KDN_HD uint64_t layer_bytes() const noexcept { return layer_elems() * kElementBytes; }
  KDN_HD uint64_t kv_bytes() const noexcept { return layers * layer_bytes(); }
  KDN_HD uint64_t slots() const noexcept { return uint64_t(num_blocks) * block_size; }
  // Bytes of KV one token takes across every layer and both planes.
  KDN_HD uint64_t token_bytes() const noexcept { return 2ull * layers * token_elems() * kElementBytes; }
  // Element index (from the first layer's first byte) of (layer, plane, slot, head, dim).
  KDN_HD uint64_t element(uint32_t layer, uint32_t plane, uint64_t slot, uint32_t head, uint32_t dim) const {
    return layer * layer_elems() + plane * plane_elems() + slot * token_elems() + uint64_t(head) * head_dim + dim;
  }
};

// The shape of a model's KV with room for `num_blocks` blocks.
PagedKvShape shape_for(const kdn_model_desc& desc, uint32_t num_blocks, uint32_t block_size = 16) noexcept;
// Enough blocks for `kv_bytes` of KV (at least one).
uint32_t blocks_for_bytes(const kdn_model_desc& desc, uint64_t kv_bytes, uint32_t block_size = 16) noexcept;

KDN_HD_INLINE uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// A finite normal fp16 (exponent field 7..22) from hash bits.
KDN_HD_INLINE uint16_t finite_half(uint64_t h) {
  const uint32_t sign = uint32_t(h >> 15) & 1u;
  const uint32_t exponent = 7u + (uint32_t(h >> 10) & 15u);
  return uint16_t((sign << 15) | (exponent << 10) | (uint32_t(h) & 0x3FFu));
}

KDN_HD_INLINE uint16_t kv_pattern(uint64_t seed, uint32_t layer, uint32_t plane, uint64_t token, uint32_t head,
                                  uint32_t dim) {
  const uint64_t where = (uint64_t(layer) << 40) ^ (uint64_t(plane) << 39) ^ (uint64_t(head) << 20) ^ dim;
  return finite_half(mix64(seed ^ mix64(where) ^ mix64(token ^ 0x5EED5EED00000000ull)));
}

KDN_HD_INLINE uint16_t canary(uint64_t seed, uint32_t layer, uint32_t plane, uint64_t slot, uint32_t head,
                              uint32_t dim) {
  return kv_pattern(~seed ^ 0xCA11A7CA11A7ull, layer, plane, slot, head, dim);
}

KDN_HD_INLINE uint8_t guard_byte(uint64_t offset) { return uint8_t(mix64(offset ^ 0x6A4D6A4Dull) >> 56); }

// What element (layer, plane, slot, head, dim) must hold when slot `slot` belongs to token
// `owner` (or to no token: owner < 0).
KDN_HD_INLINE uint16_t expected_element(uint64_t seed, int64_t owner, uint32_t layer, uint32_t plane, uint64_t slot,
                                        uint32_t head, uint32_t dim) {
  return owner >= 0 ? kv_pattern(seed, layer, plane, uint64_t(owner), head, dim)
                    : canary(seed, layer, plane, slot, head, dim);
}

// `count` distinct block ids out of [0, num_blocks), in an order shuffled by `seed`
// (Fisher-Yates over splitmix64). Empty if count > num_blocks.
std::vector<int32_t> shuffled_blocks(uint32_t num_blocks, uint32_t count, uint64_t seed);
// Block tables of a store and of a later retrieve of the same sequence: both shuffled, and no
// token lands in the slot it was stored from (when num_blocks > 1), so a retrieve that copies
// nothing cannot pass.
struct BlockTables {
  std::vector<int32_t> store, retrieve;
};
BlockTables store_and_retrieve_tables(uint32_t num_blocks, uint32_t count, uint64_t seed);

// slot_mapping of n_tokens tokens through `table`.
std::vector<int64_t> slot_mapping(const std::vector<int32_t>& table, uint64_t n_tokens, uint32_t block_size);
// The inverse: for every slot of the cache, the token that owns it, or -1.
std::vector<int32_t> slot_owners(const std::vector<int64_t>& slots, uint64_t total_slots);

// Token ids of a sequence (deterministic in seed; two engine processes with one seed ask kdnd
// for the same chunks).
std::vector<int32_t> sequence_tokens(uint64_t seed, uint64_t n_tokens);

// A kdn_engine_layout over the cache at `kv_base` (the first layer's first byte, device or
// host memory) and its slot mapping; owns the arrays the layout points into. Not copyable
// (the layout points into *this).
class EngineLayout {
 public:
  EngineLayout(const PagedKvShape& shape, uint64_t kv_base, std::vector<int64_t> slots, uint32_t dtype);
  EngineLayout(const EngineLayout&) = delete;
  EngineLayout& operator=(const EngineLayout&) = delete;
  const kdn_engine_layout* get() const noexcept { return &layout_; }
  const std::vector<int64_t>& slots() const noexcept { return slots_; }

 private:
  std::vector<void*> bases_;
  std::vector<int64_t> slots_;
  kdn_engine_layout layout_{};
};

// Byte offset, from layout.layer_base[layer], of element (plane, token, head, dim) as
// kdn_engine_layout defines it (what kdnd computes from the layout; tests compare the two).
int64_t layout_byte_offset(const kdn_engine_layout& layout, uint32_t plane, uint64_t token, uint32_t head,
                           uint32_t dim) noexcept;

// CPU references of the device kernels, for tests and small checks: fill the cache image
// `kv` (kv_bytes long) with the pattern of the tokens `owners` names and canaries elsewhere;
// count elements that differ from that.
void fill_host(uint16_t* kv, const PagedKvShape& shape, uint64_t seed, const std::vector<int32_t>& owners);
uint64_t count_mismatches_host(const uint16_t* kv, const PagedKvShape& shape, uint64_t seed,
                               const std::vector<int32_t>& owners);

enum class AllocKind : uint32_t { kIpc = KDN_GPU_MEMORY_IPC, kVmm = KDN_GPU_MEMORY_VMM_FD };
// "ipc" / "vmm"; false for anything else.
bool parse_alloc_kind(std::string_view text, AllocKind* out) noexcept;
const char* alloc_kind_name(AllocKind kind) noexcept;

}  // namespace kdn::gpu_engine

namespace kdn::gpu_engine {

// Chunk `chunk` of the sequence in kdn's canonical layout ([layer][K|V][token][head][dim],
// chunk_tokens tokens): the same pattern a cache filled by fill_host / the fill kernel holds
// for tokens chunk * chunk_tokens + t, so chunks stored from the host verify on the device.
void fill_canonical_chunk(uint16_t* dst, const PagedKvShape& shape, uint32_t chunk_tokens, uint64_t seed,
                          uint64_t chunk);

}  // namespace kdn::gpu_engine
