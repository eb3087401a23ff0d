#include "codec_speed.h"

#include <kdn/common/median.h>

#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/task_arena.h>

#include <chrono>
#include <functional>

namespace kdn::bench {
namespace {

using namespace kdn::kernels;

const kdn_key kSpeedFingerprint{0x6b646e2d636f6465ull, 0x632d73706565642eull};

// Per-chunk buffers: the encoded blob (decode input), and per-thread encode output, scratch
// and decode output, sized for the largest chunk.
struct Buffers {
  std::vector<std::vector<uint8_t>> blobs;
  std::vector<std::vector<uint8_t>> out, scratch, decoded;
};

CodecConfig config_for(const CodecConfig& cfg, const SpeedChunk& c) {
  CodecConfig k = cfg;
  k.pos_base = c.pos_base;
  return k;
}

Status prepare(const std::vector<SpeedChunk>& chunks, const CodecConfig& cfg, unsigned threads, Buffers* b) {
  size_t out = 0, scratch = 0, decoded = 0;
  for (const SpeedChunk& c : chunks) {
    const CodecConfig k = config_for(cfg, c);
    std::vector<uint8_t> blob(kvc1_max_encoded_size(c.g, k)), sc(kvc1_encode_scratch_bytes(c.g, k));
    size_t written = 0;
    KDN_RETURN_IF_ERROR(
        kvc1_encode(c.g, kSpeedFingerprint, c.data, k, blob.data(), blob.size(), &written, sc.data(), sc.size()));
    out = std::max(out, blob.size());
    scratch = std::max(scratch, sc.size());
    decoded = std::max(decoded, static_cast<size_t>(chunk_bytes(c.g)));
    blob.resize(written);
    b->blobs.push_back(std::move(blob));
  }
  b->out.assign(threads, std::vector<uint8_t>(out));
  b->scratch.assign(threads, std::vector<uint8_t>(scratch));
  b->decoded.assign(threads, std::vector<uint8_t>(decoded));
  return OkStatus();
}

// Runs fn(i, slot) for every chunk on `arena`; the first failure is the pass's.
Status run_pass(oneapi::tbb::task_arena& arena, size_t n, const std::function<Status(size_t, unsigned)>& fn) {
  std::vector<Status> st(n);
  arena.execute([&] {
    oneapi::tbb::parallel_for(size_t{0}, n, [&](size_t i) {
      st[i] = fn(i, static_cast<unsigned>(oneapi::tbb::this_task_arena::current_thread_index()));
    });
  });
  for (const Status& s : st) KDN_RETURN_IF_ERROR(s);
  return OkStatus();
}

Result<double> timed(const std::function<Status()>& pass) {
  const auto t0 = std::chrono::steady_clock::now();
  KDN_RETURN_IF_ERROR(pass());
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

Result<CodecSpeed> measure_codec_speed(const std::vector<SpeedChunk>& chunks, const CodecConfig& cfg, unsigned threads,
                                       int reps) {
  if (chunks.empty() || threads == 0 || reps < 1) return Status(Code::kInvalidArgument, "nothing to measure");
  Buffers b;
  KDN_RETURN_IF_ERROR(prepare(chunks, cfg, threads, &b));
  double fp16_bytes = 0;
  for (const SpeedChunk& c : chunks) fp16_bytes += static_cast<double>(chunk_elements(c.g)) * 2;
  oneapi::tbb::task_arena arena(static_cast<int>(threads));
  auto encode = [&] {
    return run_pass(arena, chunks.size(), [&](size_t i, unsigned slot) {
      const SpeedChunk& c = chunks[i];
      size_t written = 0;
      return kvc1_encode(c.g, kSpeedFingerprint, c.data, config_for(cfg, c), b.out[slot].data(), b.out[slot].size(),
                         &written, b.scratch[slot].data(), b.scratch[slot].size());
    });
  };
  auto decode = [&] {
    return run_pass(arena, chunks.size(), [&](size_t i, unsigned slot) {
      return kvc1_decode(b.blobs[i].data(), b.blobs[i].size(), chunks[i].g, kSpeedFingerprint, b.decoded[slot].data(),
                         chunk_bytes(chunks[i].g));
    });
  };
  KDN_RETURN_IF_ERROR(encode());
  KDN_RETURN_IF_ERROR(decode());
  std::vector<double> enc, dec, ratio;
  for (int r = 0; r < reps; ++r) {
    Result<double> te = timed(encode);
    if (!te.ok()) return te.status();
    Result<double> td = timed(decode);
    if (!td.ok()) return td.status();
    enc.push_back(fp16_bytes / *te / 1e9);
    dec.push_back(fp16_bytes / *td / 1e9);
    ratio.push_back(*td / *te);
  }
  CodecSpeed s;
  s.encode_gbps = kdn::median(std::move(enc));
  s.decode_gbps = kdn::median(std::move(dec));
  s.encode_vs_decode = kdn::median(std::move(ratio));
  return s;
}

}  // namespace kdn::bench
