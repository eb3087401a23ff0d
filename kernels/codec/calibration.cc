// The transform mode's calibration object: computing it from sample chunks (per-head
// covariance, Jacobi eigen-decomposition), writing it, and validating it.
#include "crc32c.h"
#include "encoder.h"
#include "transform_format.h"

#include <kdn/common/model.h>
#include <kdn/kernels/codec_transform.h>
#include <kdn/kernels/cpu_rows.h>

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>
#include <vector>

namespace kdn::kernels {
namespace kvc1 {
namespace {

constexpr uint64_t kCalibrationIdDomain = 0x6b766331'63616c31ull;  // "kvc1cal1"
constexpr int kMaxSweeps = 60;

// Running sums of one head's rows: count, sum and the upper triangle of sum x x^T.
struct Moments {
  uint64_t n = 0;
  std::vector<double> sum, cross;  // cross: D x D, row-major (both triangles filled at the end)
};

void add_row(Moments& m, const float* x, uint32_t d) {
  ++m.n;
  for (uint32_t i = 0; i < d; ++i) {
    m.sum[i] += x[i];
    double* row = m.cross.data() + size_t{i} * d;
    for (uint32_t j = i; j < d; ++j) row[j] += static_cast<double>(x[i]) * x[j];
  }
}

// Covariance from the sums (both triangles).
void covariance(const Moments& m, uint32_t d, std::vector<double>& c) {
  const double n = static_cast<double>(m.n);
  for (uint32_t i = 0; i < d; ++i)
    for (uint32_t j = i; j < d; ++j) {
      const double v = m.cross[size_t{i} * d + j] / n - (m.sum[i] / n) * (m.sum[j] / n);
      c[size_t{i} * d + j] = c[size_t{j} * d + i] = v;
    }
}

// One Jacobi rotation zeroing a[p][q] of the symmetric matrix a; v accumulates the rotations
// (columns are the eigenvectors).
void jacobi_rotate(std::vector<double>& a, std::vector<double>& v, uint32_t d, uint32_t p, uint32_t q) {
  const double apq = a[size_t{p} * d + q];
  if (apq == 0.0) return;
  const double theta = (a[size_t{q} * d + q] - a[size_t{p} * d + p]) / (2.0 * apq);
  const double t = (theta >= 0 ? 1.0 : -1.0) / (std::fabs(theta) + std::sqrt(theta * theta + 1.0));
  const double c = 1.0 / std::sqrt(t * t + 1.0), s = t * c;
  for (uint32_t k = 0; k < d; ++k) {  // columns p and q
    const double akp = a[size_t{k} * d + p], akq = a[size_t{k} * d + q];
    a[size_t{k} * d + p] = c * akp - s * akq;
    a[size_t{k} * d + q] = s * akp + c * akq;
  }
  for (uint32_t k = 0; k < d; ++k) {  // rows p and q
    const double apk = a[size_t{p} * d + k], aqk = a[size_t{q} * d + k];
    a[size_t{p} * d + k] = c * apk - s * aqk;
    a[size_t{q} * d + k] = s * apk + c * aqk;
  }
  for (uint32_t k = 0; k < d; ++k) {
    const double vkp = v[size_t{k} * d + p], vkq = v[size_t{k} * d + q];
    v[size_t{k} * d + p] = c * vkp - s * vkq;
    v[size_t{k} * d + q] = s * vkp + c * vkq;
  }
}

double off_diagonal(const std::vector<double>& a, uint32_t d) {
  double s = 0;
  for (uint32_t i = 0; i < d; ++i)
    for (uint32_t j = i + 1; j < d; ++j) s += a[size_t{i} * d + j] * a[size_t{i} * d + j];
  return s;
}

// Cyclic Jacobi: a becomes (nearly) diagonal, v its eigenvectors.
void eigen_symmetric(std::vector<double>& a, std::vector<double>& v, uint32_t d) {
  std::fill(v.begin(), v.end(), 0.0);
  double trace2 = 0;
  for (uint32_t i = 0; i < d; ++i) {
    v[size_t{i} * d + i] = 1.0;
    for (uint32_t j = 0; j < d; ++j) trace2 += a[size_t{i} * d + j] * a[size_t{i} * d + j];
  }
  for (int sweep = 0; sweep < kMaxSweeps && off_diagonal(a, d) > 1e-24 * trace2; ++sweep)
    for (uint32_t p = 0; p + 1 < d; ++p)
      for (uint32_t q = p + 1; q < d; ++q) jacobi_rotate(a, v, d, p, q);
}

// Writes one head's mean, variances and axes (rows, by descending variance; each axis signed
// so that its largest entry is positive, which makes the object deterministic).
void write_head(const Moments& m, uint32_t d, std::vector<double>& c, std::vector<double>& v, float* out) {
  covariance(m, d, c);
  eigen_symmetric(c, v, d);
  std::vector<uint32_t> order(d);
  for (uint32_t i = 0; i < d; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](uint32_t a, uint32_t b) { return c[size_t{a} * d + a] > c[size_t{b} * d + b]; });
  for (uint32_t i = 0; i < d; ++i) out[i] = static_cast<float>(m.sum[i] / static_cast<double>(m.n));
  for (uint32_t j = 0; j < d; ++j) {
    const uint32_t e = order[j];
    out[d + j] = static_cast<float>(std::max(0.0, c[size_t{e} * d + e]));
    uint32_t big = 0;
    for (uint32_t k = 1; k < d; ++k)
      if (std::fabs(v[size_t{k} * d + e]) > std::fabs(v[size_t{big} * d + e])) big = k;
    const double sign = v[size_t{big} * d + e] < 0 ? -1.0 : 1.0;
    for (uint32_t k = 0; k < d; ++k) out[2 * d + size_t{j} * d + k] = static_cast<float>(sign * v[size_t{k} * d + e]);
  }
}

void st32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }
void st64(uint8_t* p, uint64_t v) { std::memcpy(p, &v, 8); }

void write_cal_header(const ChunkGeometry& g, const kdn_key& fp, uint32_t samples, uint8_t* out, uint64_t total) {
  std::memset(out, 0, kCalHeaderBytes);
  std::memcpy(out, "KDNKVT1", 8);
  const uint16_t major = kCalVersionMajor, minor = kCalVersionMinor;
  std::memcpy(out + 8, &major, 2);
  std::memcpy(out + 10, &minor, 2);
  st32(out + 12, kCalHeaderBytes);
  st64(out + 16, total);
  st64(out + 24, fp.lo);
  st64(out + 32, fp.hi);
  st32(out + 40, g.layers);
  st32(out + 44, g.kv_heads);
  st32(out + 48, g.head_dim);
  st32(out + 52, samples);
  st32(out + 56, crc32c(out + kCalHeaderBytes, total - kCalHeaderBytes));
  st32(out + 60, crc32c(out, 60));
}

// Adds every usable row of (layer, plane, head) of the samples.
void accumulate(const ChunkGeometry& g, std::span<const Kvc1CalibrationSample> samples, uint32_t layer, uint32_t plane,
                uint32_t head, Moments& m, float* row) {
  for (const Kvc1CalibrationSample& s : samples) {
    const uint32_t first = s.pos_base == 0 ? std::min(kDefaultSinkTokens, g.tokens) : 0;
    for (uint32_t t = first; t < g.tokens; ++t) {
      const Source src{s.chunk, g, layer, plane};
      if (src.row_f32(t, head, row)) add_row(m, row, g.head_dim);
    }
  }
}

Status corrupt(const char* what) { return Status(Code::kCorrupt, what); }

Status check_cal_values(const float* body, const Kvc1Calibration& c) {
  const uint32_t d = c.head_dim;
  const uint64_t heads = uint64_t{c.layers} * 2 * c.kv_heads;
  for (uint64_t i = 0; i < heads; ++i) {
    const float* h = body + i * cal_head_floats(d);
    for (uint32_t k = 0; k < d; ++k)
      if (!std::isfinite(h[k]) || !std::isfinite(h[d + k]) || h[d + k] < 0.0f)
        return corrupt("KVC1 calibration has a non-finite mean or a bad variance");
    for (uint64_t k = 0; k < uint64_t{d} * d; ++k)
      if (!(std::fabs(h[2 * d + k]) <= 1.0f + 1e-5f)) return corrupt("KVC1 calibration axis entry out of range");
  }
  return OkStatus();
}

}  // namespace

const float* calibration_head(const Kvc1Calibration& c, uint32_t layer, uint32_t plane, uint32_t head) noexcept {
  return reinterpret_cast<const float*>(c.data + kCalHeaderBytes) +
         cal_head_offset(c.kv_heads, c.head_dim, layer, plane, head);
}

}  // namespace kvc1

size_t kvc1_calibration_bytes(const ChunkGeometry& g) noexcept {
  if (!kvc1::check_codec_geometry(g).ok()) return 0;
  return kvc1::kCalHeaderBytes + 4 * uint64_t{g.layers} * 2 * g.kv_heads * kvc1::cal_head_floats(g.head_dim);
}

Status kvc1_calibrate(const ChunkGeometry& g, const kdn_key& fingerprint,
                      std::span<const Kvc1CalibrationSample> samples, uint8_t* out, size_t cap,
                      size_t* written) noexcept {
  using namespace kvc1;
  KDN_RETURN_IF_ERROR(check_codec_geometry(g));
  if (samples.empty() || !out || !written)
    return Status(Code::kInvalidArgument, "calibration needs samples and output");
  if (g.dtype == DType::kFP8E4M3) return Status(Code::kUnsupported, "fp8 chunks cannot be transform-coded");
  const size_t total = kvc1_calibration_bytes(g);
  if (cap < total) return Status(Code::kNoSpace, "calibration output buffer too small");
  try {
    const uint32_t d = g.head_dim;
    std::vector<double> c(size_t{d} * d), v(size_t{d} * d);
    std::vector<float> row(d), head(cal_head_floats(d));
    uint64_t rows = 0;
    for (uint32_t l = 0; l < g.layers; ++l)
      for (uint32_t p = 0; p < 2; ++p)
        for (uint32_t h = 0; h < g.kv_heads; ++h) {
          Moments m;
          m.sum.assign(d, 0.0);
          m.cross.assign(size_t{d} * d, 0.0);
          accumulate(g, samples, l, p, h, m, row.data());
          if (m.n < 2) return Status(Code::kInvalidArgument, "calibration needs at least 2 usable rows per head");
          rows = m.n;
          write_head(m, d, c, v, head.data());
          std::memcpy(out + kCalHeaderBytes + 4 * cal_head_offset(g.kv_heads, d, l, p, h), head.data(),
                      4 * head.size());
        }
    write_cal_header(g, fingerprint, static_cast<uint32_t>(std::min<uint64_t>(rows, UINT32_MAX)), out, total);
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoMemory, "calibration accumulators");
  }
  *written = total;
  return OkStatus();
}

Status kvc1_calibration_open(const uint8_t* p, size_t len, Kvc1Calibration* out) noexcept {
  using namespace kvc1;
  if (!p || !out) return Status(Code::kInvalidArgument, "null argument");
  if (reinterpret_cast<uintptr_t>(p) % 4 != 0) return Status(Code::kInvalidArgument, "calibration not 4-byte aligned");
  if (len < kCalHeaderBytes || std::memcmp(p, "KDNKVT1", 8) != 0) return corrupt("not a KVC1 calibration object");
  if (ld16(p + 8) != kCalVersionMajor) return Status(Code::kVersion, "KVC1 calibration major version not supported");
  if (crc32c(p, 60) != ld32(p + 60)) return corrupt("KVC1 calibration header CRC mismatch");
  Kvc1Calibration c;
  c.data = p;
  c.bytes = len;
  c.fingerprint = kdn_key{ld64(p + 24), ld64(p + 32)};
  c.layers = ld32(p + 40);
  c.kv_heads = ld32(p + 44);
  c.head_dim = ld32(p + 48);
  c.samples = ld32(p + 52);
  ChunkGeometry g;
  g.layers = c.layers;
  g.kv_heads = c.kv_heads;
  g.head_dim = c.head_dim;
  g.tokens = 1;
  g.dtype = DType::kF32;
  const size_t need = kvc1_calibration_bytes(g);
  if (ld32(p + 12) != kCalHeaderBytes || need == 0 || ld64(p + 16) != len || len != need)
    return corrupt("KVC1 calibration size fields disagree");
  if (crc32c(p + kCalHeaderBytes, len - kCalHeaderBytes) != ld32(p + 56)) return corrupt("KVC1 calibration body CRC");
  KDN_RETURN_IF_ERROR(check_cal_values(reinterpret_cast<const float*>(p + kCalHeaderBytes), c));
  const XXH128_hash_t id = XXH3_128bits_withSeed(p, len, kCalibrationIdDomain);
  c.id = kdn_key{id.low64 | (id.high64 == 0 ? 1 : 0), id.high64};  // a zero id would mean "no calibration"
  *out = c;
  return OkStatus();
}

}  // namespace kdn::kernels
