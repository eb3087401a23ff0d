// `codec = auto`: the tier codec whose encode + transfer + decode time per byte of KV is least
// at the measured rates (docs/codec.md §10.8), none when no codec pays.
//
// A tier (disk slabs, the shared store) or a link moves bytes at `link_gbps`; a codec turns a
// GB of KV into 1/ratio GB at a cost of 1/encode + 1/decode seconds (both in GB of KV per
// second, on the threads the tier runs them on). The choice is a pure function of these numbers
// so a test fixes them (fault injection by the rates, not a mock) and stats print them.
//
// Thread safety: pure. Ownership: values only.
#pragma once

#include <array>
#include <cstdint>
#include <string>

namespace kdn::sidecar {

// Ids as the tiers' (chunk_codec.h): 0 none, 1 lossless, 2 int8, 3 kivi4, 4 transform.
constexpr int kChoiceCodecs = 5;

// What one codec costs and saves, measured; a codec with any rate <= 0 or a ratio <= 1 is not
// a candidate (not measured, not built, or not worth it).
struct CodecRate {
  double encode_gbps = 0;  // GB of KV encoded per second
  double decode_gbps = 0;  // GB of KV decoded per second
  double ratio = 0;        // KV bytes / stored bytes
};

struct CodecChoice {
  uint8_t codec_id = 0;
  // Seconds per GB of KV moved, per codec id (0 for codecs that were no candidate).
  std::array<double, kChoiceCodecs> seconds_per_gb{};
  std::string why;  // the numbers behind the choice, for stats and logs
};

// Chooses for a tier or link moving `link_gbps` GB of stored bytes per second. A codec wins
// only if it is at least `margin` (e.g. 0.05: 5%) faster than the next best, none included, so
// measurement noise does not flip a tier between modes.
CodecChoice choose_codec(const std::array<CodecRate, kChoiceCodecs>& rates, double link_gbps, double margin = 0.05);

}  // namespace kdn::sidecar
