// libFuzzer harness for the KVC1 decoder: any bytes go through kvc1_inspect, kvc1_decode (with
// and without CRC checks — without them the fuzzer reaches the structural checks and the rANS
// streams behind the CRCs) and kvc1_decode_scatter. The expected geometry is taken from the
// input's own header, so geometry mismatches do not stop the exploration early. The decoder
// must answer every input with a status; the sanitizers (address, undefined) catch the rest.
// A blob that names a calibration is decoded with the identity calibration of its geometry (the
// one the seed corpus codes its transform blobs with), so the transform planes are reached.
// Inputs that start with the calibration magic go to kvc1_calibration_open instead, twice: as
// they are, and with both CRCs recomputed, so the checks behind the CRCs (sizes, finite values,
// basis entries, variances) are explored too. The seeds include calibration objects.
#include "calibration_test_util.h"
#include "format.h"
#include "transform_format.h"

#include <kdn/kernels/codec.h>
#include <kdn/kernels/codec_transform.h>
#include <kdn/kernels/crc32c.h>
#include <kdn/kernels/presets.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

using namespace kdn::kernels;

constexpr uint64_t kMaxOutputBytes = 8u << 20;  // keep each run fast and small

void decode_scatter(const uint8_t* data, size_t size, const ChunkGeometry& g, const kdn_key& fp) {
  PagedShape shape;
  shape.layers = g.layers;
  shape.kv_heads = g.kv_heads;
  shape.head_dim = g.head_dim;
  shape.num_blocks = g.tokens;
  shape.block_size = 1;
  shape.dtype = DType::kF16;
  const int64_t elems = engine_layer_elements(EngineLayoutKind::kSglangTokenPool, shape);
  std::vector<std::vector<uint16_t>> k(g.layers, std::vector<uint16_t>(static_cast<size_t>(elems)));
  std::vector<std::vector<uint16_t>> v = k;
  std::vector<void*> kb, vb;
  for (auto& b : k) kb.push_back(b.data());
  for (auto& b : v) vb.push_back(b.data());
  EngineView view;
  if (!preset_view(EngineLayoutKind::kSglangTokenPool, shape, kb.data(), vb.data(), false, &view).ok()) return;
  DecodeOptions o;
  o.verify_crc = false;
  (void)kvc1_decode_scatter(data, size, g, fp, view, nullptr, o);
}

// Any bytes after the magic: the object is refused with a status, or opens into a view whose
// description agrees with its own header.
void open_calibration(const uint8_t* data, size_t size) {
  std::vector<uint32_t> words((size + 3) / 4);  // kvc1_calibration_open wants 4-byte alignment
  auto* p = reinterpret_cast<uint8_t*>(words.data());
  std::memcpy(p, data, size);
  for (bool fix_crcs : {false, true}) {
    if (fix_crcs && size >= kvc1::kCalHeaderBytes) {  // header: body CRC at 56, its own at 60
      const uint32_t body = kvc1::crc32c(p + kvc1::kCalHeaderBytes, size - kvc1::kCalHeaderBytes);
      std::memcpy(p + 56, &body, 4);
      const uint32_t head = kvc1::crc32c(p, 60);
      std::memcpy(p + 60, &head, 4);
    }
    Kvc1Calibration cal;
    if (!kvc1_calibration_open(p, size, &cal).ok()) continue;
    ChunkGeometry g;
    g.layers = cal.layers;
    g.kv_heads = cal.kv_heads;
    g.head_dim = cal.head_dim;
    g.tokens = 1;
    if (kvc1_calibration_bytes(g) != size || cal.data != p) __builtin_trap();  // a view of other bytes
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size >= 8 && std::memcmp(data, "KDNKVT1", 8) == 0) {
    open_calibration(data, size);
    return 0;
  }
  Kvc1Info info;
  (void)kvc1_inspect(data, size, &info);
  kvc1::Header h;
  if (kvc1::parse_header(data, size, &h) != kvc1::kParseOk) return 0;
  ChunkGeometry g;
  g.layers = h.layers;
  g.kv_heads = h.kv_heads;
  g.head_dim = h.head_dim;
  g.tokens = h.tokens;
  g.dtype = static_cast<DType>(h.dtype);
  const uint64_t bytes = uint64_t{g.layers} * 2 * g.tokens * g.kv_heads * g.head_dim * kvc1::dtype_bytes_of(h.dtype);
  if (bytes > kMaxOutputBytes) return 0;
  std::vector<uint8_t> out(static_cast<size_t>(bytes));
  DecodeOptions o;
  std::vector<uint8_t> cal_bytes;
  Kvc1Calibration cal;
  const uint64_t cal_floats =
      uint64_t{g.layers} * 2 * g.kv_heads * (2ull * g.head_dim + uint64_t{g.head_dim} * g.head_dim);
  if ((h.calibration_id.lo || h.calibration_id.hi) && cal_floats * 4 <= kMaxOutputBytes) {
    cal_bytes = testing::identity_calibration(g.layers, g.kv_heads, g.head_dim, h.fingerprint);
    if (kvc1_calibration_open(cal_bytes.data(), cal_bytes.size(), &cal).ok()) o.calibration = &cal;
  }
  for (bool crc : {false, true}) {
    o.verify_crc = crc;
    (void)kvc1_decode(data, size, g, h.fingerprint, out.data(), out.size(), o);
  }
  if (bytes <= (1u << 20)) decode_scatter(data, size, g, h.fingerprint);
  return 0;
}
