// The arithmetic of a guaranteed share of a daemon-wide table (admission.h, model_table.h):
// each holder is guaranteed some entries, and the entries the others have not used of their
// guarantees are not handed to a holder already past its own.
#pragma once

#include <cstdint>

namespace kdn::sidecar {

// Whether a holder that holds `held` of the `guaranteed` may take one more entry of a table of
// `capacity` where `taken` are in use and the other holders are still owed `owed_to_others`:
// always within its guarantee; past it, only if the one more fits beside what the others are
// owed. Whether the table itself has a free entry is the caller's separate check.
constexpr bool share_allows_one_more(uint64_t held, uint64_t guaranteed, uint64_t taken, uint64_t owed_to_others,
                                     uint64_t capacity) noexcept {
  return held < guaranteed || taken + 1 + owed_to_others <= capacity;
}

// What a holder holding `held` is still owed of `guaranteed`.
constexpr uint64_t still_owed(uint64_t held, uint64_t guaranteed) noexcept {
  return held < guaranteed ? guaranteed - held : 0;
}

}  // namespace kdn::sidecar
