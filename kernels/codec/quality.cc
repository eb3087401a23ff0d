// Tensor-level quality of a decoded chunk (the codec benchmark's metrics).
#include <kdn/kernels/codec.h>
#include <kdn/kernels/dtype.h>

#include <cmath>

namespace kdn::kernels {

CodecQuality kvc1_quality(const ChunkGeometry& g, const void* original, const void* decoded,
                          size_t encoded_bytes) noexcept {
  CodecQuality q;
  if (!original || !decoded || !dtype_valid(static_cast<uint32_t>(g.dtype))) return q;
  const uint64_t plane = uint64_t{g.tokens} * g.kv_heads * g.head_dim;
  const uint64_t elems = plane * 2 * g.layers;
  q.ratio_vs_fp16 = encoded_bytes ? static_cast<double>(elems * 2) / static_cast<double>(encoded_bytes) : 0.0;
  double err2 = 0, ref2 = 0;
  q.cosine_min = 1.0;
  for (uint64_t p = 0; p < 2ull * g.layers; ++p) {
    double dot = 0, xx = 0, yy = 0;
    for (uint64_t i = p * plane; i < (p + 1) * plane; ++i) {
      const double x = load_f32(original, static_cast<int64_t>(i), g.dtype, 1.0f);
      const double y = load_f32(decoded, static_cast<int64_t>(i), g.dtype, 1.0f);
      dot += x * y;
      xx += x * x;
      yy += y * y;
      err2 += (x - y) * (x - y);
    }
    ref2 += xx;
    // Two all-zero planes agree perfectly; one all-zero plane against a non-zero one does not.
    const double cos = (xx == 0 && yy == 0) ? 1.0 : (xx == 0 || yy == 0) ? 0.0 : dot / std::sqrt(xx * yy);
    if (cos < q.cosine_min) q.cosine_min = cos;
  }
  q.rel_frobenius_error = ref2 > 0 ? std::sqrt(err2 / ref2) : (err2 > 0 ? INFINITY : 0.0);
  return q;
}

}  // namespace kdn::kernels
