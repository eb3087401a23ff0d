#include <kdn/llama/kv_dump.h>

#include <kdn/kernels/kv_file.h>

#include <cstdio>
#include <filesystem>
#include <system_error>
#include <vector>

namespace kdn::llama {

Status dump_kv_chunks(Engine& engine, uint32_t n_chunks, const std::string& dir) noexcept {
  const KvGeometry& g = engine.identity().geometry;
  if (n_chunks == 0) return Status(Code::kInvalidArgument, "no whole chunk to dump");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::from_errno("cannot create the --dump-kv directory", ec.value());
  kernels::ChunkGeometry geo;
  geo.layers = g.n_layer;
  geo.kv_heads = g.n_kv_heads;
  geo.head_dim = g.head_dim;
  geo.tokens = g.chunk_tokens;
  geo.dtype = g.type == KvType::kF32    ? kernels::DType::kF32
              : g.type == KvType::kBF16 ? kernels::DType::kBF16
                                        : kernels::DType::kF16;
  std::vector<uint8_t> chunk(g.chunk_bytes());
  for (uint32_t c = 0; c < n_chunks; ++c) {
    std::span<uint8_t> out[1] = {chunk};
    KDN_RETURN_IF_ERROR(engine.extract_chunks(c, out));
    char stem[32];
    std::snprintf(stem, sizeof stem, "/chunk-%04u", c);
    KDN_RETURN_IF_ERROR(kernels::write_kv_file(dir + stem, geo, chunk.data(), engine.identity().desc.name,
                                               int64_t{c} * g.chunk_tokens));
  }
  return OkStatus();
}

}  // namespace kdn::llama
