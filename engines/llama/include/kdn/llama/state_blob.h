// Conversion between llama.cpp's per-sequence state blob and kdn's canonical chunks.
//
// llama.cpp serializes one sequence of its KV cache with llama_state_seq_get_data and loads
// one with llama_state_seq_set_data. For a plain attention cache (llama-family models, no
// M-RoPE cell extension) the blob is, all integers little-endian:
//
//   u32 magic = 0xaf143cd8; i32 seq_id (ignored on load); u32 n_stream
//   per stream: u32 cell_count; if cell_count > 0:
//     cell_count x { i32 pos; u32 n_seq_id = 1; i32 seq_id }
//     u32 v_trans; u32 n_layer
//     per layer: i32 k_type; u64 k_row_bytes; cell_count K rows            (row = [kv_head][head_dim])
//     if !v_trans: per layer: i32 v_type; u64 v_row_bytes; cell_count V rows
//     else:        per layer: i32 v_type; u32 elem_bytes; u32 n_embd_v; n_embd_v x cell_count elements
//
// A canonical chunk is [layer][K|V][token][kv_head][head_dim] for chunk_tokens tokens, so a
// chunk's K plane of one layer is exactly chunk_tokens consecutive K rows of the blob: the
// conversion is row copies (and a transpose for V when llama.cpp runs without flash
// attention). K keeps llama.cpp's per-head channel order; the model descriptor says so
// (k_channel_order = 1).
//
// Everything here is a pure function of its arguments: no llama.cpp calls, no allocation
// except SeqBlobView's per-layer pointer tables. Blobs and chunks are untrusted input: every
// length, count, type and position is checked, and every chunk must hold finite values only,
// before a byte is copied.
#pragma once

#include <kdn/common/status.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace kdn::llama {

constexpr uint32_t kSeqStateMagic = 0xaf143cd8u;

// ggml type ids of the KV element types we convert (values of enum ggml_type).
enum class KvType : int32_t { kF32 = 0, kF16 = 1, kBF16 = 30 };

// Geometry of one engine's KV cache: fixed for the life of an engine context.
struct KvGeometry {
  uint32_t n_layer = 0;        // layers with a KV cache
  uint32_t n_kv_heads = 0;     // K and V heads (equal for the models we accept)
  uint32_t head_dim = 0;       // K and V head dim (equal for the models we accept)
  KvType type = KvType::kF16;  // K and V element type
  bool v_trans = false;        // V stored transposed (llama.cpp without flash attention)
  uint32_t n_stream = 1;       // KV streams of the context (1 when kv_unified)
  uint32_t chunk_tokens = 256;

  uint32_t elem_bytes() const noexcept { return type == KvType::kF32 ? 4 : 2; }
  uint64_t row_bytes() const noexcept { return uint64_t{n_kv_heads} * head_dim * elem_bytes(); }
  uint64_t plane_bytes() const noexcept { return row_bytes() * chunk_tokens; }
  uint64_t chunk_bytes() const noexcept { return plane_bytes() * 2 * n_layer; }
};

// Ok if the geometry is one we can convert (known type, sizes in kdn's ranges).
Status validate_geometry(const KvGeometry& g) noexcept;

// Exact size in bytes of a one-sequence blob holding n_cells cells.
uint64_t seq_blob_bytes(const KvGeometry& g, uint64_t n_cells) noexcept;

// Ok if every element of `chunk` is finite and the chunk is exactly g.chunk_bytes() long.
// A chunk that fails is never loaded into an engine.
Status check_chunk(const KvGeometry& g, std::span<const uint8_t> chunk) noexcept;

// A run of a blob's bytes: `size` bytes at `data`. KV pieces are engine KV, checked finite
// (copy_finite) by whoever copies them; the others are the blob's small fields.
struct BlobPiece {
  const uint8_t* data = nullptr;
  uint64_t size = 0;
  bool kv = false;
};

// The blob of one sequence holding `chunks` in order at positions first_pos, first_pos + 1, ...
// (cells in stream 0, the other streams empty), described as pieces instead of copied: the
// header, cell metadata and per-layer fields live in an internal buffer, K rows and V rows
// point into the chunks, and a transposed V (g.v_trans) is transposed into an internal buffer.
// Concatenated, the pieces are exactly the seq_blob_bytes(g, cells) bytes of the blob.
// Buffers are reused across calls; pieces are valid until the next describe() and while the
// chunks are. Sizes and arguments are checked here, finiteness where the KV is copied.
class SeqBlobPieces {
 public:
  Status describe(const KvGeometry& g, std::span<const std::span<const uint8_t>> chunks, int32_t first_pos) noexcept;
  // Allocates the buffers for `n_chunks` chunks of geometry g now (describe does it too), so
  // a later describe of at most that many allocates nothing.
  Status reserve(const KvGeometry& g, uint64_t n_chunks) noexcept;
  std::span<const BlobPiece> pieces() const noexcept { return pieces_; }
  uint64_t size() const noexcept { return size_; }

 private:
  std::vector<uint8_t> fields_;
  std::vector<uint8_t> transposed_;
  std::vector<BlobPiece> pieces_;
  uint64_t size_ = 0;
};

// Copies `pieces` into `out` (exactly their total size), KV pieces through copy_finite;
// kCorrupt if a KV element is not finite (out then holds garbage).
Status gather_pieces(KvType type, std::span<const BlobPiece> pieces, std::span<uint8_t> out) noexcept;

// Writes into `out` (exactly seq_blob_bytes(g, chunks.size() * chunk_tokens) bytes) the blob
// SeqBlobPieces describes. Every chunk is checked (check_chunk) while it is copied; on error
// `out` holds garbage and must not be given to llama.cpp.
Status build_seq_blob(const KvGeometry& g, std::span<const std::span<const uint8_t>> chunks, int32_t first_pos,
                      std::span<uint8_t> out) noexcept;

// Whether every element of `bytes` bytes of `type` at src is finite, copying them to dst in
// the same pass (at memory speed where the CPU has AVX2 or AVX-512). When one is not, dst's
// `bytes` bytes are left all zero: a failed copy never leaves a non-finite value behind.
bool copy_finite(KvType type, uint8_t* dst, const uint8_t* src, uint64_t bytes) noexcept;

// A validated blob: pointers into its bytes, valid while the blob is.
struct SeqBlobView {
  uint32_t n_cells = 0;
  int32_t first_pos = 0;               // cells hold positions first_pos .. first_pos+n_cells-1
  std::vector<const uint8_t*> k_rows;  // per layer: n_cells rows of g.row_bytes()
  std::vector<const uint8_t*> v_data;  // per layer: rows, or n_embd_v x n_cells if v_trans
};

// Parses and validates a blob produced by llama_state_seq_get_data for a context of geometry
// g: magic, stream count, exactly one non-empty stream, one sequence per cell, consecutive
// ascending positions, v_trans, layer count, element types and row sizes, and the exact total
// length. Anything else is an error, never a partial view.
Result<SeqBlobView> parse_seq_blob(const KvGeometry& g, std::span<const uint8_t> blob) noexcept;

// Copies cells [c * chunk_tokens, (c + 1) * chunk_tokens) of a parsed blob into `out`, a
// canonical chunk of exactly g.chunk_bytes() bytes.
Status blob_chunk_to_canonical(const KvGeometry& g, const SeqBlobView& view, uint32_t c,
                               std::span<uint8_t> out) noexcept;

}  // namespace kdn::llama
