#include "codec_choice.h"

#include <cstdio>

namespace kdn::sidecar {

namespace {
const char* const kNames[kChoiceCodecs] = {"none", "lossless", "int8", "kivi4", "transform"};

bool candidate(const CodecRate& r) { return r.encode_gbps > 0 && r.decode_gbps > 0 && r.ratio > 1; }

void append(std::string* s, const char* fmt, const char* name, double a, double b, double c, double d) {
  char buf[160];
  std::snprintf(buf, sizeof(buf), fmt, name, a, b, c, d);
  *s += buf;
}
}  // namespace

CodecChoice choose_codec(const std::array<CodecRate, kChoiceCodecs>& rates, double link_gbps, double margin) {
  CodecChoice c;
  if (!(link_gbps > 0)) {
    c.why = "no measured link rate: none";
    return c;
  }
  c.seconds_per_gb[0] = 1.0 / link_gbps;
  char head[96];
  std::snprintf(head, sizeof(head), "link %.3f GB/s; s per GB of KV: none %.4f", link_gbps, c.seconds_per_gb[0]);
  c.why = head;
  // Best codec other than none, then whether it beats none by the margin.
  int best = 0;
  for (int id = 1; id < kChoiceCodecs; ++id) {
    const CodecRate& r = rates[id];
    if (!candidate(r)) continue;
    const double t = 1.0 / r.encode_gbps + 1.0 / (r.ratio * link_gbps) + 1.0 / r.decode_gbps;
    c.seconds_per_gb[id] = t;
    append(&c.why, ", %s %.4f (enc %.2f, dec %.2f GB/s, %.2fx)", kNames[id], t, r.encode_gbps, r.decode_gbps, r.ratio);
    if (best == 0 || t < c.seconds_per_gb[best]) best = id;
  }
  if (best != 0 && c.seconds_per_gb[best] * (1.0 + margin) < c.seconds_per_gb[0]) c.codec_id = uint8_t(best);
  c.why += "; chose ";
  c.why += kNames[c.codec_id];
  return c;
}

}  // namespace kdn::sidecar
