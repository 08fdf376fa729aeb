// What every CPU kernel source starts with: the headers, and small SIMD helpers (bf16 <-> fp32, 8-lane loads and a
// fixed horizontal sum) with the register tile of the fp32 dot products, shared by cpu_linear and cpu_quant.
// Internal linkage (an anonymous namespace): each .cpp that includes it has its own inline copies.
#pragma once

// torch/types.h (tensors, factories, ATen operations) rather than torch/extension.h: the kernels need no pybind11, and
// the lighter header compiles in a third of the time; the bindings_*.cpp files include torch/extension.h.
#include <torch/types.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <cmath>
#include <cstring>
#include <vector>
#include <algorithm>
#include <cstdint>

namespace {
inline __m256 load_bf16x8(const uint16_t* p) {
  __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
}

inline float hsum8(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v);
  __m128 hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  __m128 sh = _mm_movehdup_ps(lo);
  __m128 s = _mm_add_ps(lo, sh);
  sh = _mm_movehl_ps(sh, s);
  s = _mm_add_ss(s, sh);
  return _mm_cvtss_f32(s);
}

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t f32_to_bf16(float f) {  // round to nearest even, NaN kept quiet
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// Weight rows of bf16 (uint16_t) or fp32 elements: 8 lanes widened to fp32, one element, a result stored back.
inline __m256 load8(const uint16_t* p) { return load_bf16x8(p); }
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline float to_f32(uint16_t h) { return bf16_to_f32(h); }
inline float to_f32(float f) { return f; }
inline void store_f32(uint16_t* p, float f) { *p = f32_to_bf16(f); }
inline void store_f32(float* p, float f) { *p = f; }

// The dot products of a register tile: input rows m0..m0+MT-1 of x [M, K] (fp32) against the NT weight rows at w
// (row stride K).  Each (row, weight row) is one fixed sequence — 8 fp32 lanes in k order, a fixed horizontal sum,
// the scalar tail — whatever MT, NT, the tile or the call: a row's result does not depend on its batch.
template <int MT, int NT, typename E>
inline void tile(const float* x, int64_t K, const E* w, int64_t m0, float* out) {
  __m256 acc[MT][NT];
  for (int i = 0; i < MT; ++i)
    for (int j = 0; j < NT; ++j) acc[i][j] = _mm256_setzero_ps();
  const int64_t K8 = K & ~int64_t(7);
  for (int64_t k = 0; k < K8; k += 8) {
    __m256 wv[NT];
    for (int j = 0; j < NT; ++j) wv[j] = load8(w + j * K + k);
    for (int i = 0; i < MT; ++i) {
      const __m256 xv = _mm256_loadu_ps(x + (m0 + i) * K + k);
      for (int j = 0; j < NT; ++j) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
  for (int i = 0; i < MT; ++i)
    for (int j = 0; j < NT; ++j) {
      float s = hsum8(acc[i][j]);
      for (int64_t k = K8; k < K; ++k) s += x[(m0 + i) * K + k] * to_f32(w[j * K + k]);
      out[i * NT + j] = s;
    }
}

}  // namespace
