// Host-side validation of a KVC1 blob: everything the decoders rely on, checked before any
// symbol is decoded. A blob that passes can be decoded by the CPU or CUDA decoder without any
// out-of-bounds access; the rANS end-state check then catches what CRCs cannot (or what a
// caller skipped by turning CRCs off).
#pragma once

#include "format.h"

#include <kdn/common/status.h>
#include <kdn/kernels/layout.h>

#include <cstdint>

namespace kdn::kernels::kvc1 {

// Maps a ParseError onto a Status.
Status parse_status(uint32_t err) noexcept;

// Parses the header, checks the header and directory CRCs (when verify_crc) and that the
// layer records are laid out canonically (consecutive, 16-byte aligned, ending the blob).
Status open_blob(const uint8_t* blob, uint64_t len, bool verify_crc, Header* h) noexcept;

// kModelMismatch unless the header describes exactly this geometry and fingerprint.
Status match_expected(const Header& h, const ChunkGeometry& g, const kdn_key& fingerprint) noexcept;

// Validates layer `layer` completely: record CRC (when verify_crc), both plane records, their
// parameters (finite, non-negative scales; exponent references in range), segment directories,
// frequency tables and block descriptors, all in canonical placement. On success out[0..1]
// are the K and V planes.
Status validate_layer(const uint8_t* blob, const Header& h, uint32_t layer, bool verify_crc, Plane out[2]) noexcept;

// Pieces of validate_layer that transform planes share: canonical segment placement, a rANS
// segment's table and blocks, and finite exact rows.
Status validate_segment_placement(const uint8_t* blob, const Plane& pl) noexcept;
Status validate_rans_segment(const uint8_t* blob, const Segment& sg) noexcept;
Status validate_exact_values(const uint8_t* e, uint64_t elems, uint32_t dtype) noexcept;

// validate_layer's checks of a kCodecTransform plane (validate_transform.cc): header fields,
// widths, scales, exact rows and band segments.
Status check_transform_plane(const uint8_t* blob, const Header& h, const Plane& pl) noexcept;

}  // namespace kdn::kernels::kvc1
