// A hand-built calibration object for tests and the fuzzer: zero means, unit variances falling
// by a fixed ratio along the axes, and the identity basis (transform coding then quantizes
// each channel on its own), with valid CRCs, for any geometry.
#pragma once

#include "crc32c.h"
#include "transform_format.h"

#include <kdn/kernels/codec_transform.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace kdn::kernels::testing {

inline std::vector<uint8_t> identity_calibration(uint32_t layers, uint32_t heads, uint32_t dim, const kdn_key& fp) {
  using namespace kvc1;
  const uint64_t floats = uint64_t{layers} * 2 * heads * cal_head_floats(dim);
  std::vector<uint8_t> obj(kCalHeaderBytes + 4 * floats, 0);
  std::vector<float> head(cal_head_floats(dim), 0.0f);
  float var = 1.0f;
  for (uint32_t j = 0; j < dim; ++j, var *= 0.9f) {
    head[dim + j] = var;
    head[2 * dim + size_t{j} * dim + j] = 1.0f;
  }
  for (uint64_t i = 0; i < uint64_t{layers} * 2 * heads; ++i)
    std::memcpy(obj.data() + kCalHeaderBytes + 4 * i * head.size(), head.data(), 4 * head.size());
  auto st = [&](size_t at, const void* v, size_t n) { std::memcpy(obj.data() + at, v, n); };
  const uint16_t major = kCalVersionMajor;
  const uint32_t hb = kCalHeaderBytes, samples = 0;
  const uint64_t total = obj.size();
  std::memcpy(obj.data(), "KDNKVT1", 8);
  st(8, &major, 2);
  st(12, &hb, 4);
  st(16, &total, 8);
  st(24, &fp.lo, 8);
  st(32, &fp.hi, 8);
  st(40, &layers, 4);
  st(44, &heads, 4);
  st(48, &dim, 4);
  st(52, &samples, 4);
  const uint32_t body = crc32c(obj.data() + kCalHeaderBytes, obj.size() - kCalHeaderBytes);
  st(56, &body, 4);
  const uint32_t head_crc = crc32c(obj.data(), 60);
  st(60, &head_crc, 4);
  return obj;
}

}  // namespace kdn::kernels::testing
