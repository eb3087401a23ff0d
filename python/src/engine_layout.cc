#include "engine_layout.h"

#include "client.h"

#include <algorithm>
#include <string>

namespace kdn::python {
namespace {

__extension__ using i128 = __int128;

[[noreturn]] void invalid(const std::string& what) { throw Error(KDN_ERR_INVALID_ARGUMENT, what); }

// Lowest and highest element offset (from a layer's base) that the layout reaches.
struct Extent {
  i128 lo = 0, hi = 0;
  void add(int64_t stride, uint64_t count) {
    const i128 span = i128(stride) * i128(count - 1);
    (span < 0 ? lo : hi) += span;
  }
};

Extent extent_of(const PagedLayout& l) {
  Extent e;
  e.add(l.stride_block, l.num_blocks);
  e.add(l.stride_offset, uint64_t(l.block_size));
  e.add(l.stride_head, l.kv_heads);
  e.add(l.stride_dim, l.head_dim);
  e.add(l.stride_kv, 2);
  return e;
}

}  // namespace

void validate_layout(const PagedLayout& l) {
  if (l.layer_base.empty()) invalid("the layout has no layers");
  if (l.elem_bytes == 0 || l.elem_bytes > 8) invalid("the layout's element size is not 1..8 bytes");
  if (l.num_blocks == 0 || l.block_size <= 0 || l.kv_heads == 0 || l.head_dim == 0)
    invalid("the layout has an empty dimension");
  if (l.num_blocks > (uint64_t{1} << 40) || l.block_size > (int64_t{1} << 20))
    invalid("the layout's block count or block size is out of range");
  for (int64_t s : {l.stride_block, l.stride_head, l.stride_offset, l.stride_dim, l.stride_kv})
    if (s > (int64_t{1} << 50) || s < -(int64_t{1} << 50)) invalid("a layout stride is out of range");
  for (uint64_t b : l.layer_base)
    if (b == 0) invalid("a layer base is null");
}

void check_layout_within(const PagedLayout& l, uint64_t base, uint64_t bytes) {
  validate_layout(l);
  const Extent e = extent_of(l);
  const i128 lo_limit = base, hi_limit = i128(base) + bytes;
  for (size_t i = 0; i < l.layer_base.size(); ++i) {
    const i128 first = i128(l.layer_base[i]) + e.lo * l.elem_bytes;
    const i128 end = i128(l.layer_base[i]) + (e.hi + 1) * l.elem_bytes;
    if (first < lo_limit || end > hi_limit)
      invalid("layer " + std::to_string(i) + " of the layout reaches bytes [" +
              std::to_string(int64_t(first - lo_limit)) + ", " + std::to_string(int64_t(end - lo_limit)) +
              ") of an allocation of " + std::to_string(bytes) + " bytes");
  }
}

std::pair<uint64_t, uint64_t> layout_bytes(const PagedLayout& l) {
  validate_layout(l);
  const Extent e = extent_of(l);
  i128 first = 0, end = 0;
  for (size_t i = 0; i < l.layer_base.size(); ++i) {
    const i128 f = i128(l.layer_base[i]) + e.lo * l.elem_bytes, x = i128(l.layer_base[i]) + (e.hi + 1) * l.elem_bytes;
    first = i == 0 ? f : std::min(first, f);
    end = i == 0 ? x : std::max(end, x);
  }
  if (first < 0 || end > i128(UINT64_MAX)) invalid("the layout reaches outside the address space");
  return {uint64_t(first), uint64_t(end)};
}

kdn_engine_layout layout_abi(const PagedLayout& l, std::vector<void*>& bases,
                             std::span<const int64_t> slot_mapping) noexcept {
  bases.clear();
  for (uint64_t b : l.layer_base) bases.push_back(reinterpret_cast<void*>(b));
  kdn_engine_layout a{};
  a.struct_size = sizeof a;
  a.engine_dtype = l.dtype;
  a.layer_base = bases.data();
  a.stride_kv = l.stride_kv;
  a.stride_block = l.stride_block;
  a.stride_offset = l.stride_offset;
  a.stride_head = l.stride_head;
  a.stride_dim = l.stride_dim;
  a.block_size = l.block_size;
  a.slot_mapping = slot_mapping.empty() ? nullptr : slot_mapping.data();
  return a;
}

}  // namespace kdn::python
