// Canonical KV chunk files: real KV captured from an engine, for benchmarks and codec studies.
//
// A chunk is two files with one stem (docs/kernels.md describes them):
//   STEM.kv    the raw canonical chunk bytes [layer][K|V][token][kv_head][head_dim], little endian;
//   STEM.json  {"format": "kdn-kv-chunk", "version": 1, "layers": L, "kv_heads": H,
//               "head_dim": D, "tokens": T, "dtype": "f16" | "bf16" | "f32",
//               "model": "...", "first_position": P}     ("model" and "first_position" optional)
// The .kv size must equal L * 2 * T * H * D * sizeof(dtype). Files are untrusted input: every
// field is validated and a mismatch is an error, never a crash.
#pragma once

#include <kdn/common/status.h>
#include <kdn/kernels/layout.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kdn::kernels {

struct KvFileInfo {
  ChunkGeometry geo;
  std::string model;
  int64_t first_position = 0;
  std::string kv_path;    // STEM.kv
  std::string json_path;  // STEM.json
};

// Parses STEM.json and checks STEM.kv's size against it.
Result<KvFileInfo> read_kv_file_info(const std::string& json_path) noexcept;

// Reads the chunk bytes into buf (cap >= chunk_bytes(info.geo)).
Status read_kv_file(const KvFileInfo& info, void* buf, size_t cap) noexcept;

// Writes STEM.kv and STEM.json for a canonical chunk.
Status write_kv_file(const std::string& stem, const ChunkGeometry& geo, const void* chunk, const std::string& model,
                     int64_t first_position) noexcept;

// Every valid chunk (STEM.json + STEM.kv) in `dir`, sorted by path. Invalid pairs are skipped
// and counted in *skipped (may be null).
Result<std::vector<KvFileInfo>> list_kv_dir(const std::string& dir, size_t* skipped) noexcept;

}  // namespace kdn::kernels
