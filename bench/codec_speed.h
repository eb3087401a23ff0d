// Encode and decode speed of the KVC1 codec on a set of chunks, measured as pairs: each
// repetition times one encode pass and one decode pass back to back, so their ratio sees the
// same machine load (the bars read that ratio; the medians of the two rates are reported
// beside it). Used by `kdn-bench kernels` on synthetic and real (--kv-dir) chunks.
#pragma once

#include <kdn/common/status.h>
#include <kdn/kernels/codec.h>

#include <cstdint>
#include <vector>

namespace kdn::bench {

struct SpeedChunk {
  kernels::ChunkGeometry g;
  const void* data;  // canonical chunk; the caller keeps it alive
  int64_t pos_base;
};

struct CodecSpeed {
  double encode_gbps = 0;       // median, fp16 bytes of KV per second
  double decode_gbps = 0;       // median, fp16 bytes of KV per second
  double encode_vs_decode = 0;  // median over the repetitions of encode rate / decode rate
};

// Encodes (then decodes) every chunk once per pass with `cfg` (pos_base taken from the
// chunk), spread over `threads` threads; one untimed warm-up pair, then `reps` timed pairs.
Result<CodecSpeed> measure_codec_speed(const std::vector<SpeedChunk>& chunks, const kernels::CodecConfig& cfg,
                                       unsigned threads, int reps);

}  // namespace kdn::bench
