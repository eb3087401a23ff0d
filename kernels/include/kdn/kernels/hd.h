// Single-source plumbing for kdn's kernels.
//
// Every kernel's per-element (or per-row-segment) body is an inline function marked KDN_HD.
// Compiled by nvcc it is `__host__ __device__`; compiled by a host compiler the macro is empty.
// The CPU launcher (oneTBB) and the CUDA launcher run the same body, so the exact per-element
// logic is tested on every CPU machine.
//
// Bit-exactness between CPU and CUDA. Floating-point arithmetic in bodies goes through fmul_rn /
// fadd_rn / fsub_rn / fdiv_rn: on the device these are the `__f*_rn` intrinsics, which nvcc never
// fuses into an FMA; on the host they are plain IEEE operations, and kdn_kernels propagates
// -ffp-contract=off to every host translation unit that links it. Both sides therefore round each
// operation exactly once, in the same order.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define KDN_HD __host__ __device__
#define KDN_HD_INLINE __host__ __device__ __forceinline__
#else
#define KDN_HD
#define KDN_HD_INLINE inline
#endif

namespace kdn::kernels {

// Reinterprets the bits of `from` (same size, trivially copyable). memcpy is legal and free in
// both host and device code; std::bit_cast is not yet available in device code everywhere.
template <class To, class From>
KDN_HD_INLINE To bits_as(const From& from) {
  static_assert(sizeof(To) == sizeof(From));
  To to;
  memcpy(&to, &from, sizeof(To));
  return to;
}

KDN_HD_INLINE float fmul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

KDN_HD_INLINE float fadd_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

KDN_HD_INLINE float fsub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

KDN_HD_INLINE float fdiv_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

}  // namespace kdn::kernels
