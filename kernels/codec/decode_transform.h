// CPU decoding of transform-coded planes (decode_transform.cc), used by kvc1_decode.
#pragma once

#include "format.h"

#include <kdn/common/status.h>
#include <kdn/kernels/codec.h>

#include <cstdint>

namespace kdn::kernels::kvc1 {

// Decodes a validated kCodecTransform plane of (layer, plane) into the canonical chunk's plane
// starting at plane_out (tokens x kv_heads x head_dim elements of the chunk dtype).
Status decode_transform_plane(const uint8_t* blob, const Header& h, const Plane& pl, const Kvc1Calibration& cal,
                              uint32_t layer, uint32_t plane, uint8_t* plane_out) noexcept;

// Whether `opts` carries the calibration the blob names (always true for a blob that names
// none): kNotFound when it is missing or another one, kModelMismatch when it is for another
// model or geometry.
Status match_calibration(const Header& h, const kdn_key& fingerprint, const DecodeOptions& opts) noexcept;

}  // namespace kdn::kernels::kvc1
