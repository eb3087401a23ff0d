// KVC1: the chunk codec. Encodes one canonical KV chunk, laid out
// [layer][K|V][token][kv_head][head_dim] in fp16, bf16 or fp32, into a self-describing,
// CRC-checked blob, and decodes it back on the CPU (this header) or on a GPU (codec_cuda.h).
// docs/codec.md documents every byte of the format.
//
// Modes (CodecMode):
//   raw       source bytes verbatim (still framed and CRC-checked);
//   lossless  bit-exact: each element's exponent is rebased on its channel's largest
//             exponent, then the element's bytes are split into byte planes and each plane
//             is rANS-coded where that is smaller;
//   int8      8-bit asymmetric quantization per (token, head) for K and V;
//   kivi4/2   4- or 2-bit KIVI-style quantization: K per channel over groups of tokens,
//             V per token over groups of channels; per-layer bit widths optional.
// Quantized symbols are entropy-coded with 32-lane interleaved rANS (12-bit probabilities,
// one frequency table per (layer, plane, head) segment) whenever that beats bit packing.
//
// Ownership: every function here works on caller-owned memory and never allocates. Sizes
// are queried first (kvc1_max_encoded_size, kvc1_encode_scratch_bytes); the CPU decoder
// works in bounded stack tiles (at most about 110 KiB of stack per thread, for head_dim
// 4096) and needs no scratch.
//
// Thread safety: all functions are reentrant; concurrent calls on distinct outputs are safe.
// DecodeOptions::cpu_threads != 1 spreads one chunk over the oneTBB worker pool.
//
// Untrusted input: a blob is untrusted. Decoding validates the header, the layer directory,
// CRC32C of the header, directory and every layer record, every length and offset, every
// frequency table and the rANS end state, and answers bad input with an error status
// (kCorrupt, kVersion or kModelMismatch); it never reads outside [blob, blob + len) nor
// writes outside the output it was given.
#pragma once

#include <kdn/common/model.h>
#include <kdn/common/status.h>
#include <kdn/kdn.h>
#include <kdn/kernels/layout.h>
#include <kdn/kernels/ops.h>
#include <kdn/kernels/rope.h>

#include <cstddef>
#include <cstdint>
#include <span>

namespace kdn::kernels {

enum class CodecMode : uint8_t {
  kRaw = 0,
  kLossless = 1,
  kInt8 = 2,
  kKivi4 = 3,
  kKivi2 = 4,
  // Transform coding (codec_transform.h): a calibrated per-(layer, plane, head) decorrelating
  // basis, widths allotted by each coordinate's variance, rANS. Needs a Kvc1Calibration.
  kTransform = 5,
};

struct Kvc1Calibration;  // codec_transform.h

// Name of a mode ("raw", "lossless", "int8", "kivi4", "kivi2", "transform"); "unknown" otherwise.
const char* codec_mode_name(CodecMode mode) noexcept;

// Code width of a quantized mode (int8 8, kivi4 4, kivi2 2); 0 for raw and lossless.
uint8_t codec_mode_default_bits(CodecMode mode) noexcept;

// The chunk shape is kdn/kernels/layout.h's ChunkGeometry; the codec handles dtypes f16, bf16
// and f32 (fp8 chunks in raw mode only). The model fingerprint travels beside it: the encoder
// records it, the decoder refuses a blob recorded for another model.

// The geometry of a full chunk of `model` (tokens = chunk_tokens).
ChunkGeometry kvc1_geometry(const ModelInfo& model) noexcept;

constexpr uint32_t kDefaultSinkTokens = 4;
constexpr uint32_t kDefaultRecentTokens = 32;

// Encoder settings. Zero means "the mode's default" for every numeric field except
// sink_tokens, pos_base and the per-layer arrays.
struct CodecConfig {
  CodecMode mode = CodecMode::kKivi4;
  // Bit widths (1..8) of K and V codes for quantized modes; defaults: int8 8, kivi4 4,
  // kivi2 2. Must stay 0 for raw and lossless.
  uint8_t k_bits = 0;
  uint8_t v_bits = 0;
  // Optional per-layer bit widths (`layers` entries each, 1..8) overriding k_bits/v_bits,
  // e.g. 8 bits for the first layers. Quantized modes only; the arrays are read, not kept.
  const uint8_t* layer_k_bits = nullptr;
  const uint8_t* layer_v_bits = nullptr;
  // K (kivi modes): tokens per per-channel group. Default kDefaultKGroupTokens, capped at T.
  uint32_t k_group_tokens = 0;
  // V (kivi modes): channels per per-token group; must divide head_dim. Default head_dim.
  uint32_t v_group_channels = 0;
  // Tokens per rANS block (the unit one GPU warp decodes). Default kDefaultBlockTokens.
  uint32_t block_tokens = 0;
  // rANS-code each segment when that is smaller than packing its codes (never larger).
  bool entropy = true;
  // With entropy: code a channel's difference to the previous token instead of its value
  // where that is cheaper (chosen per channel; pays off on KV with token-wise locality).
  bool token_delta = true;
  // Quantized modes: quantize every (token, head) row of K and V after a Hadamard rotation of
  // its channels (head_dim must be a power of two); the decoder rotates back. K then uses
  // per-token groups of head_dim channels instead of per-channel groups. Spreads outlier
  // channels over the row, which lowers the error of attention scores at the same size.
  bool rotate = false;
  // Store quantizer scales and zero points as fp32 instead of fp16 (fp16 planes switch to
  // fp32 by themselves when a value does not fit fp16).
  bool f32_scales = false;
  // Quantized modes: in a chunk that starts its sequence (pos_base 0), the first sink_tokens
  // tokens are stored exactly instead of quantized, and left out of the quantizer ranges. Most
  // attention heads put much of their weight on a sequence's first tokens (attention sinks),
  // so their K and V errors reach every later token; keeping them costs sink_tokens rows at the
  // chunk's dtype in that one chunk (every row of a shorter chunk). 0 turns it off; raw and
  // lossless chunks are exact anyway.
  uint32_t sink_tokens = kDefaultSinkTokens;
  // Quantized modes: in a chunk that ends a stored context (ends_context), the last
  // recent_tokens tokens (at most those the sinks leave, and never all T) are stored exactly
  // instead of coded, as KIVI keeps a sequence's most recent tokens in full precision. The
  // tokens an engine computes right after a cached context (the question after a document) put
  // much of their attention on the context's last tokens, so the error of those rows costs the
  // most; every other chunk of the context is unchanged. The cost is recent_tokens rows at the
  // chunk's dtype in that one chunk, less their codes. 0 turns it off.
  uint32_t recent_tokens = kDefaultRecentTokens;
  // The chunk is the last of the context it was cut from: whoever stores a context's chunks
  // sets it on the last one.
  bool ends_context = false;
  // Absolute position of token 0, recorded for RoPE re-positioning at decode time.
  int64_t pos_base = 0;
  // Optional chunk key recorded in the header (zero when the index holds it).
  kdn_key chunk_key{};
  // Transform mode: the calibration to code with (read, not kept; its id goes into the blob),
  // and the mean code width per element before entropy coding (0: 2 bits), spent per
  // (layer, plane) on the coordinates with the most variance.
  const Kvc1Calibration* calibration = nullptr;
  double transform_mean_bits = 0;
};

constexpr uint32_t kDefaultKGroupTokens = 128;
constexpr uint32_t kDefaultBlockTokens = 256;

// Upper bound of the blob size kvc1_encode can produce; 0 if g or cfg is invalid.
size_t kvc1_max_encoded_size(const ChunkGeometry& g, const CodecConfig& cfg) noexcept;

// Scratch kvc1_encode needs; 0 if g or cfg is invalid.
size_t kvc1_encode_scratch_bytes(const ChunkGeometry& g, const CodecConfig& cfg) noexcept;

// Encodes the canonical chunk `chunk` (chunk_bytes(g) bytes) of the model `fingerprint`
// names into out[0, cap). On success *written holds the blob size. Errors: kInvalidArgument (bad geometry or
// config, NaN/Inf in a quantized mode, scratch too small), kNoSpace (cap too small;
// kvc1_max_encoded_size is always enough). The output is deterministic: the same input and
// config give the same bytes on every machine.
Status kvc1_encode(const ChunkGeometry& g, const kdn_key& fingerprint, const void* chunk, const CodecConfig& cfg,
                   uint8_t* out, size_t cap, size_t* written, void* scratch, size_t scratch_bytes) noexcept;

// What a blob's header says about it.
struct Kvc1Info {
  uint16_t version_major = 0;
  uint16_t version_minor = 0;
  uint64_t total_bytes = 0;
  ChunkGeometry geometry;
  kdn_key fingerprint{};
  CodecMode mode = CodecMode::kRaw;
  uint32_t block_tokens = 0;
  int64_t pos_base = 0;
  kdn_key chunk_key{};
  kdn_key calibration_id{};  // zero unless the blob needs a calibration object (transform mode)
};

// Validates the header and the layer directory (magic, version, lengths, CRCs) and
// describes the blob. Does not touch layer records.
Status kvc1_inspect(const uint8_t* blob, size_t len, Kvc1Info* out) noexcept;

struct DecodeOptions {
  // Decode these layers only (end 0: through the last). The output is still the whole
  // canonical chunk; other layers are left untouched.
  LayerRange layers;
  // As Executor::cpu_threads: 1 = the calling thread only (the default), 0 = every oneTBB
  // worker, n = at most n threads. Work is split by (layer, plane, head).
  int cpu_threads = 1;
  // Check CRC32C of header, directory and layer records. Only fuzzers turn this off, to
  // reach the structural checks behind it; those always run.
  bool verify_crc = true;
  // Blobs whose header names a calibration (Kvc1Info::calibration_id) decode only with that
  // calibration: without it, or with another one, decoding fails with kNotFound (the chunk
  // is unreadable here, a miss). With verify_crc off the id is not compared (fuzzing).
  const Kvc1Calibration* calibration = nullptr;
};

// Decodes `blob` into the canonical chunk `out` (out_bytes >= chunk_bytes(expected)).
// `expected` and `fingerprint` must match the blob's (else kModelMismatch). Every check
// except the rANS end state runs before the first byte is written; a stream that fails its
// end state (only possible with CRCs off, or a CRC collision) leaves `out` partly written.
// Nothing outside `out` is ever written.
Status kvc1_decode(const uint8_t* blob, size_t len, const ChunkGeometry& expected, const kdn_key& fingerprint,
                   void* out, size_t out_bytes, const DecodeOptions& opts = {}) noexcept;

// Fused decode -> dequantize -> (K) RoPE delta -> scatter into an engine buffer: chunk token
// t goes to the view's engine token t (slot from view.slot_mapping; slots < 0 are skipped;
// a slot >= view.slot_limit fails the call before anything is written). `rope` may be null
// (no rotation); otherwise K is rotated by the table's delta in fp32 after dequantization
// and rounded once into the engine dtype (build the table with delta = target position -
// Kvc1Info::pos_base). The view is checked against `expected` (validate_view), every layer
// base of the range must be non-null, and the rope table must fit head_dim. Same error
// contract as kvc1_decode, with the engine buffer in the role of `out`.
Status kvc1_decode_scatter(const uint8_t* blob, size_t len, const ChunkGeometry& expected, const kdn_key& fingerprint,
                           const EngineView& dst, const RopeTable* rope, const DecodeOptions& opts = {}) noexcept;

// Tensor-level quality of a decoded chunk against its original (both canonical, same
// geometry), and the compression ratio for a blob of `encoded_bytes`.
struct CodecQuality {
  double ratio_vs_fp16 = 0;        // (elements * 2 bytes) / encoded_bytes
  double rel_frobenius_error = 0;  // ||x - x^||_F / ||x||_F over the whole chunk
  double cosine_min = 0;           // min over (layer, plane) of cos(x, x^)
};
CodecQuality kvc1_quality(const ChunkGeometry& g, const void* original, const void* decoded,
                          size_t encoded_bytes) noexcept;

// Per-layer bit widths for a quantized mode, from measured sensitivities. sensitivity[i] is
// the model-quality cost (e.g. the mean KL divergence of next-token distributions) of
// quantizing only layer i's K (k_sensitivity) or V (v_sensitivity) at probe_bits, everything
// else exact. The cost of b bits is modelled as sensitivity * 4^(probe_bits - b) (each bit
// halves the quantization step, so the error power falls 4x), the slots' costs as additive,
// and the widths minimise their sum with at most mean_bits * 2 * layers bits in all, each in
// [min_bits, max_bits]: greedily, one bit at a time to the slot it helps most, which is exact
// for costs that fall geometrically. Ties (e.g. zero sensitivities) go to the narrower slot,
// then the lower layer, K before V, so the result is deterministic and equal sensitivities
// get equal widths. Errors: kInvalidArgument for spans of different or zero length, a
// sensitivity that is negative or not finite, or bounds outside 1 <= min_bits <= mean_bits
// <= max_bits <= 8 (probe_bits 1..8). Writes k_bits and v_bits only on success.
Status kvc1_allocate_bits(std::span<const double> k_sensitivity, std::span<const double> v_sensitivity,
                          uint32_t probe_bits, double mean_bits, uint32_t min_bits, uint32_t max_bits,
                          std::span<uint8_t> k_bits, std::span<uint8_t> v_bits) noexcept;

// The modelled cost of a width: sensitivity * 4^(probe_bits - bits).
double kvc1_modelled_cost(double sensitivity, uint32_t probe_bits, uint32_t bits) noexcept;

}  // namespace kdn::kernels
