// An engine's paged KV memory as kdn_engine_layout describes it, built from the sizes and
// strides of the engine's own tensors (kdn/torch.py derives them from vLLM's layer views), and
// the check that every element it can reach lies inside one allocation.
//
// The check is what makes a registration honest: kdnd refuses a GPU request whose layout leaves
// the registered range, but the engine learns of a bad derivation only then, request by request.
// Checking once, at registration, against the allocation the handle names turns a wrong view
// (another backing allocation, a stride past the end) into one clear error before any copy.
//
// Errors throw Error (client.h) with KDN_ERR_INVALID_ARGUMENT: these run on behalf of Python.
// Thread safety: plain functions over immutable data.
#pragma once

#include <kdn/kdn.h>

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace kdn::python {

struct PagedLayout {
  uint32_t dtype = 0;                // kdn_dtype
  uint32_t elem_bytes = 0;           // of dtype
  std::vector<uint64_t> layer_base;  // address of element (block 0, head 0, token 0, channel 0) per layer
  uint64_t num_blocks = 0;           // kernel blocks
  int64_t block_size = 0;            // tokens per kernel block
  uint32_t kv_heads = 0, head_dim = 0;
  // In elements. V of (block, head, token, channel) is at K's address + stride_kv.
  int64_t stride_block = 0, stride_head = 0, stride_offset = 0, stride_dim = 0, stride_kv = 0;
};

// Throws unless every field is in range (the extents then fit in 64 bits).
void validate_layout(const PagedLayout& l);

// Throws, naming the layer and the bytes, unless every byte any (plane, block, head,
// token, channel) of every layer reaches lies in [base, base + bytes).
void check_layout_within(const PagedLayout& l, uint64_t base, uint64_t bytes);

// [first, end): the bytes the layout reaches, over all layers (validated first).
std::pair<uint64_t, uint64_t> layout_bytes(const PagedLayout& l);

// The C ABI struct for a call: `bases` receives the layer pointers (it must outlive the struct),
// slot_mapping is the caller's (one slot per token of the range).
kdn_engine_layout layout_abi(const PagedLayout& l, std::vector<void*>& bases,
                             std::span<const int64_t> slot_mapping) noexcept;

}  // namespace kdn::python
