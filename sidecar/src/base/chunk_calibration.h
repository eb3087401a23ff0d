// The calibrations the tiers code transform-mode chunks with (docs/codec.md §10.5).
//
// A transform blob decodes only with the calibration object it names (Kvc1Info::calibration_id),
// so whoever encodes or decodes such a blob holds the object here: the tiers add each object
// they write or fetch (add validates it and, when a caller asks for a given id, checks the
// object is that one), encoders take the current calibration of their model, decoders look a
// blob's calibration up by id. A calibration that is not here makes the blob unreadable, a miss.
//
// calibration_store_key: where a tier keeps a calibration object, a key in a hash domain of its
// own, so it never collides with a chunk key and any node computes it from a blob alone.
//
// Ownership: the catalog owns a copy of every object (4-byte aligned, as kvc1_calibration_open
// needs); a CalibrationRef keeps its object alive after the catalog drops it.
// Thread safety: every member may be called from any thread (one mutex; lookups are short).
#pragma once

#include "aligned_buffer.h"

#include <kdn/common/model.h>
#include <kdn/common/status.h>
#include <kdn/kdn.h>
#include <kdn/kernels/codec_transform.h>

#include <cstddef>
#include <memory>
#include <mutex>
#include <span>
#include <unordered_map>

namespace kdn::sidecar {

// A validated calibration object and the bytes it views.
struct CalibrationObject {
  AlignedBuffer bytes;            // the object is bytes[0, view.bytes) (the buffer is rounded up)
  kernels::Kvc1Calibration view;  // points into `bytes`
};
using CalibrationRef = std::shared_ptr<const CalibrationObject>;

// The key a tier stores the calibration `id` of the model `fingerprint` under.
kdn_key calibration_store_key(const kdn_key& fingerprint, const kdn_key& id) noexcept;

class CalibrationCatalog {
 public:
  // Validates `object` and keeps a copy (an object already held is not copied again). With
  // `expect_id`, the object must be that calibration (kCorrupt otherwise: a damaged or swapped
  // object). `make_current` makes it the one encoders of its model use. Errors: kCorrupt and
  // kVersion from kvc1_calibration_open, kNoMemory.
  Status add(std::span<const std::byte> object, const kdn_key* expect_id, bool make_current,
             CalibrationRef* out = nullptr) noexcept;
  // The calibration `id`, or null.
  CalibrationRef find(const kdn_key& id) const noexcept;
  // The calibration encoders of `fingerprint`'s model use, or null (its chunks are then coded
  // in the tier's other modes or stored raw).
  CalibrationRef current(const kdn_key& fingerprint) const noexcept;
  size_t size() const noexcept;

 private:
  mutable std::mutex mu_;
  std::unordered_map<kdn_key, CalibrationRef, KeyHash> by_id_;
  std::unordered_map<kdn_key, CalibrationRef, KeyHash> current_;
};

}  // namespace kdn::sidecar
