#include <kdn/gpu_engine/paged_kv.h>

#include <algorithm>
#include <numeric>

namespace kdn::gpu_engine {

PagedKvShape shape_for(const kdn_model_desc& desc, uint32_t num_blocks, uint32_t block_size) noexcept {
  PagedKvShape s;
  s.layers = desc.num_layers;
  s.kv_heads = desc.num_kv_heads;
  s.head_dim = desc.head_dim;
  s.block_size = block_size;
  s.num_blocks = num_blocks;
  return s;
}

uint32_t blocks_for_bytes(const kdn_model_desc& desc, uint64_t kv_bytes, uint32_t block_size) noexcept {
  const uint64_t per_block = shape_for(desc, 1, block_size).kv_bytes();
  if (per_block == 0) return 1;
  return uint32_t(std::max<uint64_t>(1, std::min<uint64_t>(kv_bytes / per_block, UINT32_MAX)));
}

std::vector<int32_t> shuffled_blocks(uint32_t num_blocks, uint32_t count, uint64_t seed) {
  if (count > num_blocks) return {};
  std::vector<int32_t> ids(num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  uint64_t state = seed;
  for (uint32_t i = num_blocks; i > 1; --i) {
    state = mix64(state);
    std::swap(ids[i - 1], ids[state % i]);
  }
  ids.resize(count);
  return ids;
}

BlockTables store_and_retrieve_tables(uint32_t num_blocks, uint32_t count, uint64_t seed) {
  BlockTables t;
  t.store = shuffled_blocks(num_blocks, count, mix64(seed ^ 0x57));
  t.retrieve = shuffled_blocks(num_blocks, count, mix64(seed ^ 0x4E));
  if (num_blocks < 2) return t;
  // A token whose block came out equal in both swaps it with the next token's: the ids are
  // distinct, so neither of the two lands on its stored block afterwards.
  for (uint32_t i = 0; i < count; ++i) {
    if (t.retrieve[i] != t.store[i]) continue;
    if (count >= 2)
      std::swap(t.retrieve[i], t.retrieve[(i + 1) % count]);
    else
      t.retrieve[i] = (t.store[i] + 1) % int32_t(num_blocks);
  }
  return t;
}

std::vector<int64_t> slot_mapping(const std::vector<int32_t>& table, uint64_t n_tokens, uint32_t block_size) {
  std::vector<int64_t> slots(n_tokens);
  for (uint64_t t = 0; t < n_tokens; ++t)
    slots[t] = int64_t(table[t / block_size]) * block_size + int64_t(t % block_size);
  return slots;
}

std::vector<int32_t> slot_owners(const std::vector<int64_t>& slots, uint64_t total_slots) {
  std::vector<int32_t> owners(total_slots, -1);
  for (size_t t = 0; t < slots.size(); ++t) {
    if (slots[t] >= 0 && uint64_t(slots[t]) < total_slots) owners[slots[t]] = int32_t(t);
  }
  return owners;
}

std::vector<int32_t> sequence_tokens(uint64_t seed, uint64_t n_tokens) {
  std::vector<int32_t> tokens(n_tokens);
  for (uint64_t i = 0; i < n_tokens; ++i) tokens[i] = int32_t(mix64(seed * 0x10001ull + i) % 128000);
  return tokens;
}

EngineLayout::EngineLayout(const PagedKvShape& shape, uint64_t kv_base, std::vector<int64_t> slots, uint32_t dtype)
    : bases_(shape.layers), slots_(std::move(slots)) {
  for (uint32_t l = 0; l < shape.layers; ++l) {
    bases_[l] = reinterpret_cast<void*>(kv_base + uint64_t(l) * shape.layer_bytes());
  }
  layout_.struct_size = sizeof(kdn_engine_layout);
  layout_.engine_dtype = dtype;
  layout_.layer_base = bases_.data();
  layout_.stride_kv = int64_t(shape.plane_elems());
  layout_.stride_block = int64_t(shape.block_elems());
  layout_.stride_offset = int64_t(shape.token_elems());
  layout_.stride_head = shape.head_dim;
  layout_.stride_dim = 1;
  layout_.block_size = shape.block_size;
  layout_.slot_mapping = slots_.data();
}

int64_t layout_byte_offset(const kdn_engine_layout& layout, uint32_t plane, uint64_t token, uint32_t head,
                           uint32_t dim) noexcept {
  const int64_t slot = layout.slot_mapping ? layout.slot_mapping[token] : int64_t(token);
  const int64_t blk = slot / layout.block_size, off = slot % layout.block_size;
  const int64_t elems = plane * layout.stride_kv + blk * layout.stride_block + off * layout.stride_offset +
                        int64_t(head) * layout.stride_head + int64_t(dim) * layout.stride_dim;
  return elems * int64_t(kElementBytes);
}

void fill_host(uint16_t* kv, const PagedKvShape& shape, uint64_t seed, const std::vector<int32_t>& owners) {
  for (uint32_t l = 0; l < shape.layers; ++l)
    for (uint32_t p = 0; p < 2; ++p)
      for (uint64_t s = 0; s < shape.slots(); ++s)
        for (uint32_t h = 0; h < shape.kv_heads; ++h)
          for (uint32_t d = 0; d < shape.head_dim; ++d)
            kv[shape.element(l, p, s, h, d)] = expected_element(seed, owners[s], l, p, s, h, d);
}

uint64_t count_mismatches_host(const uint16_t* kv, const PagedKvShape& shape, uint64_t seed,
                               const std::vector<int32_t>& owners) {
  uint64_t bad = 0;
  for (uint32_t l = 0; l < shape.layers; ++l)
    for (uint32_t p = 0; p < 2; ++p)
      for (uint64_t s = 0; s < shape.slots(); ++s)
        for (uint32_t h = 0; h < shape.kv_heads; ++h)
          for (uint32_t d = 0; d < shape.head_dim; ++d)
            bad += kv[shape.element(l, p, s, h, d)] != expected_element(seed, owners[s], l, p, s, h, d);
  return bad;
}

bool parse_alloc_kind(std::string_view text, AllocKind* out) noexcept {
  if (text == "ipc")
    *out = AllocKind::kIpc;
  else if (text == "vmm")
    *out = AllocKind::kVmm;
  else
    return false;
  return true;
}

const char* alloc_kind_name(AllocKind kind) noexcept { return kind == AllocKind::kIpc ? "ipc" : "vmm"; }

}  // namespace kdn::gpu_engine

namespace kdn::gpu_engine {

void fill_canonical_chunk(uint16_t* dst, const PagedKvShape& shape, uint32_t chunk_tokens, uint64_t seed,
                          uint64_t chunk) {
  const uint64_t first = chunk * chunk_tokens;
  for (uint32_t l = 0; l < shape.layers; ++l)
    for (uint32_t p = 0; p < 2; ++p)
      for (uint32_t t = 0; t < chunk_tokens; ++t)
        for (uint32_t h = 0; h < shape.kv_heads; ++h)
          for (uint32_t d = 0; d < shape.head_dim; ++d) *dst++ = kv_pattern(seed, l, p, first + t, h, d);
}

}  // namespace kdn::gpu_engine
