// Copies between kdn's canonical chunks and vLLM's CPU paged KV cache.
//
// vLLM's CPU attention backend keeps one tensor per attention layer, shaped
// [num_blocks, kv_heads, block_tokens, 2 * head_dim]. The last two dimensions are not
// "K then V of each token": the backend views them as [2 * block_tokens, head_dim] and takes
// the first block_tokens rows for K and the rest for V, and its reshape_and_cache kernel then
// lays each (block, head) region out for the ISA that computes attention:
//
//   kColumnsRows ("vec", "vec16"): K column-major [head_dim][block_tokens] (element (t, d) at
//       d * B + t), V row-major [block_tokens][head_dim] (at B * D + t * D + d);
//   kAmx ("amx", 2-byte types): K as 32-bit channel pairs in groups of 16 tokens
//       ((t / 16) * 16 * D + (d / 2) * 32 + (t % 16) * 2 + d % 2), V as token pairs in groups
//       of 16 channels (B * D + (d / 16) * 16 * B + (t / 2) * 32 + (d % 16) * 2 + t % 2).
//
// block_element() is that index function; the copies below are its fast forms. A chunk of
// kdn (chunk_tokens, a multiple of block_tokens) covers chunk_tokens / block_tokens engine
// blocks, so a chunk is always whole blocks and the intra-block layout never splits.
//
// Every KV element read from a chunk is checked finite on its way into the cache (an element
// whose exponent bits are all ones is Inf or NaN); a chunk that holds one is not left in the
// cache: the blocks it was written to are zeroed, and the caller recomputes them.
//
// Ownership: PagedKV borrows the layer tensors (the caller keeps them alive and does not
// resize them). Thread safety: one call at a time; each call fans out to the worker pool.
#pragma once

#include <kdn/common/status.h>

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace kdn::python {

enum class BlockLayout : uint32_t {
  kColumnsRows = 1,  // vLLM CPU "vec" / "vec16"
  kAmx = 2,          // vLLM CPU "amx" (2-byte element types only)
};

// Parses vLLM's ISA name ("vec", "vec16", "amx"); false for layouts kdn does not know.
bool block_layout_from_isa(const char* isa, BlockLayout* out) noexcept;

struct PagedGeometry {
  uint32_t layers = 0;
  uint32_t kv_heads = 0;
  uint32_t head_dim = 0;
  uint32_t block_tokens = 0;
  uint32_t chunk_tokens = 0;  // a multiple of block_tokens
  uint32_t elem_bytes = 0;    // 2 (bf16, f16) or 4 (f32)
  uint32_t dtype = 0;         // kdn_dtype: how to recognise a non-finite element
  uint64_t num_blocks = 0;
  int64_t stride_block = 0;  // elements between blocks of one layer tensor
  int64_t stride_head = 0;   // elements between heads of one block
  BlockLayout layout = BlockLayout::kColumnsRows;
};

// Element offset of (plane, token t in the block, channel d) inside one (block, head) region.
uint64_t block_element(BlockLayout layout, uint32_t plane, uint32_t t, uint32_t d, uint32_t block_tokens,
                       uint32_t head_dim) noexcept;

// What one chunk's copy did.
struct ChunkCopy {
  const uint8_t* chunk = nullptr;   // canonical bytes (scatter: read; gather: see gather())
  std::span<const int64_t> blocks;  // engine block of each of the chunk's blocks; < 0: skip it
};

class PagedKV {
 public:
  // Validates the geometry (every field in range, the strides able to hold a region) and the
  // layer bases (one non-null base per layer). threads: workers besides the caller (0: none).
  static Result<std::unique_ptr<PagedKV>> create(const PagedGeometry& g, std::vector<uint8_t*> layers,
                                                 uint32_t threads) noexcept;
  ~PagedKV();
  PagedKV(const PagedKV&) = delete;
  PagedKV& operator=(const PagedKV&) = delete;

  const PagedGeometry& geometry() const noexcept { return g_; }
  uint64_t chunk_bytes() const noexcept;
  uint32_t blocks_per_chunk() const noexcept { return g_.chunk_tokens / g_.block_tokens; }

  // Scatters chunks into the cache, all layers, on the pool. ok[i] tells whether chunk i was
  // finite; a chunk that was not leaves zeros in its blocks. Block ids must be < num_blocks
  // (checked: kInvalidArgument before anything is written).
  Status scatter(std::span<const ChunkCopy> chunks, std::span<uint8_t> ok) noexcept;
  // Gathers the blocks of each chunk into out[i] (chunk_bytes() each). Blocks must be valid.
  Status gather(std::span<const std::span<const int64_t>> blocks, std::span<uint8_t* const> out) noexcept;

 private:
  class Pool;
  PagedKV(const PagedGeometry& g, std::vector<uint8_t*> layers) noexcept;
  Status check_blocks(std::span<const int64_t> blocks) const noexcept;
  uint8_t* region(uint32_t layer, int64_t block, uint32_t head) const noexcept;
  bool scatter_item(const ChunkCopy& c, uint32_t layer) const noexcept;
  void gather_item(std::span<const int64_t> blocks, uint8_t* out, uint32_t layer) const noexcept;
  void zero_item(const ChunkCopy& c, uint32_t layer) const noexcept;

  PagedGeometry g_;
  std::vector<uint8_t*> layers_;
  std::unique_ptr<Pool> pool_;
};

}  // namespace kdn::python
