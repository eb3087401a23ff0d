#include <kdn/common/model.h>
#include <kdn/kernels/segment.h>

#include <cstring>
#include <memory>
#include <new>

namespace kdn::kernels {
namespace {

Status invalid(const char* what) { return Status(Code::kInvalidArgument, what); }

// Tokens chunk i of a segment of n tokens holds (T per chunk, the last maybe fewer).
uint32_t rows_of(uint64_t n_tokens, uint32_t t, size_t i) {
  const uint64_t first = uint64_t(i) * t;
  return n_tokens - first >= t ? t : uint32_t(n_tokens - first);
}

// The view of chunk i: its tokens are engine tokens first_token + iT ... With fewer rows than
// T, a local slot table maps rows past the segment's end to -1 (skipped).
EngineView chunk_view(const EngineView& v, uint32_t t, size_t i, uint32_t rows, int64_t* table) {
  EngineView c = v;
  c.first_token = v.first_token + int64_t(i) * t;
  if (rows == t) return c;
  for (uint32_t r = 0; r < t; ++r) table[r] = r < rows ? token_slot(c, r) : -1;
  c.slot_mapping = table;
  c.first_token = 0;
  return c;
}

// Room for one chunk's slot table when the segment ends inside a chunk.
Status slot_table(uint64_t n_tokens, uint32_t t, std::unique_ptr<int64_t[]>* out) {
  if (n_tokens % t == 0) return OkStatus();
  out->reset(new (std::nothrow) int64_t[t]);
  return *out ? OkStatus() : Status(Code::kNoMemory, "segment: no memory for a slot table");
}

Status check_tokens(size_t n_chunks, uint64_t n_tokens, uint32_t t, bool all_chunks) {
  if (n_chunks == 0 || n_tokens == 0) return invalid("segment: no chunks or no tokens");
  if (n_tokens > uint64_t(n_chunks) * t) return invalid("segment: more tokens than its chunks hold");
  if (all_chunks && n_tokens <= uint64_t(n_chunks - 1) * t) return invalid("segment: more chunks than its tokens need");
  return OkStatus();
}

// Every slot of the segment's tokens, before a byte moves: a bad slot in the last chunk must
// not leave the first ones written.
Status check_slots(const EngineView& v, uint64_t n_tokens) {
  if (v.slot_limit == 0) return OkStatus();
  for (uint64_t t = 0; t < n_tokens; ++t) {
    const int64_t slot = token_slot(v, uint32_t(t));
    if (slot >= v.slot_limit) return invalid("segment: a slot is beyond the engine buffer");
  }
  return OkStatus();
}

}  // namespace

Status segment_rope_from_desc(const kdn_model_desc& desc, float* inv_freq, size_t n, SegmentRope* out) noexcept {
  if (out == nullptr) return invalid("segment: null rope output");
  RopeConfig cfg;
  KDN_RETURN_IF_ERROR(rope_config_from_desc(desc, &cfg));
  KDN_RETURN_IF_ERROR(compute_inv_freq(cfg, inv_freq, n));
  out->style = cfg.style;
  out->rotary_dim = rotary_dim_of(cfg);
  out->inv_freq = inv_freq;
  return OkStatus();
}

Status scatter_segment(std::span<const void* const> chunks, uint64_t n_tokens, const ChunkGeometry& geo,
                       const EngineView& dst, const SegmentRope& rope, int64_t delta, const Executor& ex,
                       LayerRange layers) noexcept {
  if (ex.kind != Executor::Kind::kCpu) return Status(Code::kUnsupported, "segment ops run on the CPU");
  KDN_RETURN_IF_ERROR(validate_geometry(geo));
  KDN_RETURN_IF_ERROR(check_tokens(chunks.size(), n_tokens, geo.tokens, true));
  if (delta > kMaxPosition || delta < -kMaxPosition) return invalid("segment: position delta out of range");
  if (delta != 0 && (rope.inv_freq == nullptr || rope.rotary_dim == 0 || rope.rotary_dim > geo.head_dim))
    return invalid("segment: a rotation needs the model's RoPE");
  float cos_sin[kMaxHeadDim];
  RopeTable table;
  if (delta != 0) {
    KDN_RETURN_IF_ERROR(build_rope_table(rope.inv_freq, rope.rotary_dim, &delta, 1, cos_sin, kMaxHeadDim));
    table = RopeTable{rope.style, rope.rotary_dim, cos_sin, 0};
  }
  KDN_RETURN_IF_ERROR(check_slots(dst, n_tokens));
  for (const void* c : chunks)
    if (c == nullptr) return invalid("segment: null chunk");
  std::unique_ptr<int64_t[]> slots;
  KDN_RETURN_IF_ERROR(slot_table(n_tokens, geo.tokens, &slots));
  for (size_t i = 0; i < chunks.size(); ++i) {
    const uint32_t rows = rows_of(n_tokens, geo.tokens, i);
    const EngineView v = chunk_view(dst, geo.tokens, i, rows, slots.get());
    KDN_RETURN_IF_ERROR(delta == 0 ? scatter(chunks[i], geo, v, ex, layers)
                                   : rope_scatter(chunks[i], geo, v, table, ex, layers));
  }
  return OkStatus();
}

Status gather_segment(const EngineView& src, std::span<void* const> chunks, uint64_t n_tokens, const ChunkGeometry& geo,
                      const Executor& ex) noexcept {
  if (ex.kind != Executor::Kind::kCpu) return Status(Code::kUnsupported, "segment ops run on the CPU");
  KDN_RETURN_IF_ERROR(validate_geometry(geo));
  KDN_RETURN_IF_ERROR(check_tokens(chunks.size(), n_tokens, geo.tokens, true));
  const uint64_t elem = dtype_size(geo.dtype);
  const uint64_t row = uint64_t(geo.kv_heads) * geo.head_dim * elem;
  std::unique_ptr<int64_t[]> slots;
  KDN_RETURN_IF_ERROR(slot_table(n_tokens, geo.tokens, &slots));
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (chunks[i] == nullptr) continue;
    const uint32_t rows = rows_of(n_tokens, geo.tokens, i);
    const EngineView v = chunk_view(src, geo.tokens, i, rows, slots.get());
    KDN_RETURN_IF_ERROR(gather(v, chunks[i], geo, ex));
    if (rows == geo.tokens) continue;
    // Rows past the segment's end: zero, so a stored chunk never carries stale bytes.
    auto* bytes = static_cast<uint8_t*>(chunks[i]);
    for (uint32_t l = 0; l < geo.layers; ++l)
      for (uint32_t p = 0; p < 2; ++p)
        std::memset(bytes + chunk_offset(geo, l, p, rows, 0, 0) * elem, 0, (geo.tokens - rows) * row);
  }
  return OkStatus();
}

}  // namespace kdn::kernels
