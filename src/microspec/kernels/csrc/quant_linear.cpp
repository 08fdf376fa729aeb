// Products with packed GGUF weights, y = x W^T: linear_q on fp32 activations (a chunk of weight rows unpacked to
// fp32 in L2, then the register tiles of common.h) and linear_q8, the integer path (activations quantized to int8
// per 32-element block, exact int32 group sums; the file's blocks and the interleaved forms of blocks.h).
#include "blocks.h"
#include "quant.h"

#include <atomic>

namespace {

// ---------------------------------------------------------------------------------------------------------------
// The integer path (as ggml does it): activations quantized per 32-element block to int8 with an fp32 scale, each
// 32-element group of a weight row as 32 int8 values q with scales (s_lo for elements 0..15, s_hi for 16..31) and,
// for the types with a minimum, a min term mm, so that weight = s * q + mm; a group's dot product is then an exact
// int32 sum of int8 products:  sum_k w_k x_k = dx * (s * sum_k q_k qx_k) + mm * (dx * sum_k qx_k).
// The weight blocks are unpacked in registers, group by group, inside the product (no unpacked copy in memory).
// Types whose q is unsigned (all but Q8_0) go straight into maddubs (unsigned x signed); an offset type (weight =
// s * (u - OFF): Q4_0, Q5_0, Q6_K) subtracts the row's per-lane sums of OFF * qx, computed once per call: the same
// int32 lanes as sum (u - OFF) qx, exactly.  Q8_0's signed q uses the sign trick (|q| x sign(qx, q)).

// 32 nibbles of qs[16]: element i < 16 the low nibble of qs[i], element 16 + i its high nibble
inline __m256i nib32v(const uint8_t* qs) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i m4 = _mm_set1_epi8(15);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), m4), _mm_and_si128(raw, m4));
}
// 16 in byte i where bit i of the 32-bit qh is set, else 0
inline __m256i bit16(const uint8_t* qh4) {
  uint32_t qh; std::memcpy(&qh, qh4, 4);
  const __m256i sel = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                       2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m256i bit = _mm256_set1_epi64x(0x8040201008040201LL);
  const __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(int(qh)), sel);
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit), _mm256_set1_epi8(16));
}

// Q4_K / Q5_K: sub-block j's scale d * sc and min term -(dmin * m)
inline void k4_scale(const uint8_t* b, int j, float& s, float& mm) {
  int sc, m;
  scale_min_k4(b + 4, j, sc, m);
  s = h2f(b) * float(sc);
  mm = -(h2f(b + 2) * float(m));
}

// Weight types on the integer path.  A block (BLOCK elements, BYTES bytes) holds BLOCK / 32 groups; `prep` decodes
// what its groups share (the K-quants' sub-block scales), `group` gives group j (elements 32j..32j+31 of the block)
// as q (int8 lanes), scales sv (s_lo in lanes 0..3, s_hi in 4..7) and min term mm.  SIGNED: q signed (sign trick);
// else q unsigned, weight = s * (q - OFF) (+ mm where MIN).
struct NoPrep {};
#define WTYPE32(NAME, BYTES, OFF, MIN, SIGNED) \
  struct NAME { static constexpr int block = 32, bytes = BYTES, off = OFF; \
                static constexpr bool min = MIN, sign = SIGNED; using Prep = NoPrep; \
                static inline void prep(const uint8_t*, Prep&) {} \
                static inline void group(const Prep&, const uint8_t* b, int, __m256i& q, __m256& sv, float& mm); }; \
  inline void NAME::group(const Prep&, const uint8_t* b, int, __m256i& q, __m256& sv, float& mm)

WTYPE32(WQ8_0, 34, 0, false, true) { q = load256(b + 2); sv = _mm256_set1_ps(h2f(b)); (void)mm; }
WTYPE32(WQ4_0, 18, 8, false, false) { q = nib32v(b + 2); sv = _mm256_set1_ps(h2f(b)); (void)mm; }
WTYPE32(WQ4_1, 20, 0, true, false) { q = nib32v(b + 4); sv = _mm256_set1_ps(h2f(b)); mm = h2f(b + 2); }
WTYPE32(WQ5_0, 22, 16, false, false) {
  q = _mm256_or_si256(nib32v(b + 6), bit16(b + 2)); sv = _mm256_set1_ps(h2f(b)); (void)mm;
}
WTYPE32(WQ5_1, 24, 0, true, false) {
  q = _mm256_or_si256(nib32v(b + 8), bit16(b + 4)); sv = _mm256_set1_ps(h2f(b)); mm = h2f(b + 2);
}
#undef WTYPE32

// Q4_K / Q5_K: the 8 sub-blocks' scales d * sc and min terms -(dmin * m)
struct K4Prep { float s[8], mm[8]; };
inline void k4_prep(const uint8_t* b, K4Prep& p) {
  const float d = h2f(b), dmin = h2f(b + 2);
  for (int j = 0; j < 8; ++j) {
    int sc, m;
    scale_min_k4(b + 4, j, sc, m);
    p.s[j] = d * float(sc);
    p.mm[j] = -(dmin * float(m));
  }
}
struct WQ4_K {  // sub-block j: the low (j even) or high nibbles of bytes 32 (j / 2)..
  static constexpr int block = 256, bytes = 144, off = 0;
  static constexpr bool min = true, sign = false;
  using Prep = K4Prep;
  static inline void prep(const uint8_t* b, Prep& p) { k4_prep(b, p); }
  static inline void group(const Prep& p, const uint8_t* b, int j, __m256i& q, __m256& sv, float& mm) {
    const __m256i v = load256(b + 16 + 32 * (j >> 1));
    q = _mm256_and_si256(j & 1 ? _mm256_srli_epi16(v, 4) : v, _mm256_set1_epi8(15));
    sv = _mm256_set1_ps(p.s[j]); mm = p.mm[j];
  }
};
struct WQ5_K {  // as Q4_K, with bit j of qh[p] as the 5th bit of element p
  static constexpr int block = 256, bytes = 176, off = 0;
  static constexpr bool min = true, sign = false;
  using Prep = K4Prep;
  static inline void prep(const uint8_t* b, Prep& p) { k4_prep(b, p); }
  static inline void group(const Prep& p, const uint8_t* b, int j, __m256i& q, __m256& sv, float& mm) {
    const __m256i v = load256(b + 48 + 32 * (j >> 1));
    const __m256i lo = _mm256_and_si256(j & 1 ? _mm256_srli_epi16(v, 4) : v, _mm256_set1_epi8(15));
    const __m256i hi = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(load256(b + 16), j), _mm256_set1_epi8(1)), 4);
    q = _mm256_or_si256(lo, hi);
    sv = _mm256_set1_ps(p.s[j]); mm = p.mm[j];
  }
};
struct Q6Prep { float s[16]; };
struct WQ6_K {  // elements 32j..: ql bytes h*64 + p0.., nibble (j%4)/2; qh bits 2*(j%4); scales d * sc[16]
  static constexpr int block = 256, bytes = 210, off = 32;
  static constexpr bool min = false, sign = false;
  using Prep = Q6Prep;
  static inline void prep(const uint8_t* b, Prep& p) {
    const __m256 d = _mm256_set1_ps(h2f(b + 208));
    const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192));
    _mm256_storeu_ps(p.s, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc))));
    _mm256_storeu_ps(p.s + 8, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8)))));
  }
  static inline void group(const Prep& p, const uint8_t* b, int j, __m256i& q, __m256& sv, float&) {
    const int h = j / 4, p0 = (j % 2) * 32;
    const __m256i l = load256(b + h * 64 + p0);
    const __m256i lo = _mm256_and_si256((j % 4) / 2 ? _mm256_srli_epi16(l, 4) : l, _mm256_set1_epi8(15));
    const __m256i hh = _mm256_and_si256(_mm256_srli_epi16(load256(b + 128 + h * 32), 2 * (j % 4)), _mm256_set1_epi8(3));
    q = _mm256_or_si256(lo, _mm256_slli_epi16(hh, 4));
    sv = _mm256_set_m128(_mm_set1_ps(p.s[2 * j + 1]), _mm_set1_ps(p.s[2 * j]));
  }
};

// Row x[K] -> int8 qx[K], per 32-block scale dx = max|x| / 127 and dxs = dx * sum(qx): qx = round-to-nearest-even
// (x * (1 / dx)), all in fp32 (what `quantize_activations` in the Python module computes).
void quant_row(const float* x, int64_t K, int8_t* qx, float* dx, float* dxs) {
  for (int64_t b = 0; b < K / 32; ++b) {
    const float* xb = x + 32 * b;
    __m256 mx = _mm256_setzero_ps();
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int g = 0; g < 4; ++g) mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, _mm256_loadu_ps(xb + 8 * g)));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float d = _mm_cvtss_f32(m4) / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    int sum = 0;
    for (int g = 0; g < 4; ++g) {
      const __m256 v = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(xb + 8 * g), _mm256_set1_ps(id)),
                                       _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      alignas(32) int32_t tmp[8];
      _mm256_store_si256(reinterpret_cast<__m256i*>(tmp), _mm256_cvtps_epi32(v));
      for (int j = 0; j < 8; ++j) { qx[32 * b + 8 * g + j] = int8_t(tmp[j]); sum += tmp[j]; }
    }
    dx[b] = d;
    dxs[b] = d * float(sum);
  }
}

// Quantized activation rows: int8 q [M, K], scales d and d * sum(q) [M, G], and for an offset type the per-lane
// sums of OFF * q [M, G, 8] (int32).
struct Act { const int8_t* q; const float* d; const float* ds; const int32_t* off; int64_t K, G; };

// Tile: activation rows m0..m0+MT-1 against the NT weight rows at w, w + RB, ...  Each (row, weight row) sum:
// acc = fma(s_lanes * dx, int32 lanes, acc) over the groups in order, then hsum, then + the min terms summed in order.
template <class W, int MT, int NT>
inline void tile_i8(const Act& a, const uint8_t* w, int64_t RB, int64_t m0, float* out) {
  __m256 acc[MT][NT];
  float accm[MT][NT];
  for (int i = 0; i < MT; ++i)
    for (int j = 0; j < NT; ++j) { acc[i][j] = _mm256_setzero_ps(); accm[i][j] = 0.0f; }
  const __m256i ones = _mm256_set1_epi16(1);
  constexpr int GPB = W::block / 32;
  for (int64_t blk = 0; blk < a.G / GPB; ++blk) {
    typename W::Prep pr[NT];
    for (int j = 0; j < NT; ++j) W::prep(w + j * RB + blk * W::bytes, pr[j]);
    _mm_prefetch(reinterpret_cast<const char*>(w + 32 * RB + blk * W::bytes), _MM_HINT_T1);
#pragma GCC unroll 8
    for (int jj = 0; jj < GPB; ++jj) {
      const int64_t g = blk * GPB + jj;
      __m256i q[NT], aq[NT];
      __m256 sv[NT];
      float mm[NT];
      for (int j = 0; j < NT; ++j) {
        W::group(pr[j], w + j * RB + blk * W::bytes, jj, q[j], sv[j], mm[j]);
        if (W::sign) aq[j] = _mm256_sign_epi8(q[j], q[j]);
      }
      for (int i = 0; i < MT; ++i) {
        const int64_t r = m0 + i;
        const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q + r * a.K + g * 32));
        const __m256 d = _mm256_set1_ps(a.d[r * a.G + g]);
        __m256i ov = _mm256_setzero_si256();
        if (W::off) ov = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.off + (r * a.G + g) * 8));
        for (int j = 0; j < NT; ++j) {
          const __m256i p16 = W::sign ? _mm256_maddubs_epi16(aq[j], _mm256_sign_epi8(xv, q[j]))
                                      : _mm256_maddubs_epi16(q[j], xv);
          __m256i p = _mm256_madd_epi16(p16, ones);
          if (W::off) p = _mm256_sub_epi32(p, ov);
          acc[i][j] = _mm256_fmadd_ps(_mm256_mul_ps(sv[j], d), _mm256_cvtepi32_ps(p), acc[i][j]);
          if (W::min) accm[i][j] += mm[j] * a.ds[r * a.G + g];
        }
      }
    }
  }
  for (int i = 0; i < MT; ++i)
    for (int j = 0; j < NT; ++j) out[i * NT + j] = W::min ? hsum8(acc[i][j]) + accm[i][j] : hsum8(acc[i][j]);
}

// All activation rows mb..me-1 against weight rows t0..t0+nt-1 (nt <= NT) at w (row t0), written to out[M, N]:
// tiles of up to MT_MAX activation rows by NT weight rows (register tiles; the sums do not depend on the tiling).
constexpr int MT_MAX = 4;
constexpr int NT_I8 = 2;

template <class W, int NT, int MT>
inline void tile_or_columns(const Act& a, const uint8_t* w, int64_t RB, int64_t m0, int64_t nt, float* buf) {
  if (nt == NT) { tile_i8<W, MT, NT>(a, w, RB, m0, buf); return; }
  for (int64_t j = 0; j < nt; ++j) {
    float one[MT];
    tile_i8<W, MT, 1>(a, w + j * RB, RB, m0, one);
    for (int i = 0; i < MT; ++i) buf[i * NT + j] = one[i];
  }
}

template <class W>
inline void rows_i8(const Act& a, const uint8_t* w, int64_t RB, int64_t mb, int64_t me, int64_t nt, int64_t t0,
                    int64_t N, float* op) {
  constexpr int NT = NT_I8;
  if (me - mb == 1) {  // one row (a decode step)
    for (int64_t j = 0; j < nt; ++j) {
      float v;
      tile_i8<W, 1, 1>(a, w + j * RB, RB, mb, &v);
      op[mb * N + t0 + j] = v;
    }
    return;
  }
  float buf[MT_MAX * NT];
  for (int64_t m0 = mb; m0 < me; m0 += MT_MAX) {
    const int64_t mt = std::min<int64_t>(MT_MAX, me - m0);
    switch (mt) {
      case 4: tile_or_columns<W, NT, 4>(a, w, RB, m0, nt, buf); break;
      case 3: tile_or_columns<W, NT, 3>(a, w, RB, m0, nt, buf); break;
      case 2: tile_or_columns<W, NT, 2>(a, w, RB, m0, nt, buf); break;
      default: tile_or_columns<W, NT, 1>(a, w, RB, m0, nt, buf); break;
    }
    for (int64_t i = 0; i < mt; ++i)
      for (int64_t j = 0; j < nt; ++j) op[(m0 + i) * N + t0 + j] = buf[i * NT + j];
  }
}

// The integer path of linear_q: x quantized per row and 32-block to int8 (see quant_row), weight groups unpacked in
// registers, exact int32 group sums, fp32 accumulation in a fixed order (batch-invariant like linear_q).  The weight
// rows go in chunks of ~48 KiB (L2) and 2 rows per tile; inside a chunk the input rows go in blocks of 16.
template <class W>
void linear_q8_type(const int8_t* qx, const float* dx, const float* dxs, int64_t M, int64_t K, const uint8_t* wp,
                    int64_t N, int64_t RB, float* op) {
  const int64_t G = K / 32;
  std::vector<int32_t> off(W::off ? M * G * 8 : 0);
  if (W::off) {  // per-lane sums of OFF * qx, as the products' madd lanes sum them
    const __m256i c = _mm256_set1_epi8(W::off), ones = _mm256_set1_epi16(1);
    for (int64_t i = 0; i < M * G; ++i)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(off.data() + 8 * i),
                          _mm256_madd_epi16(_mm256_maddubs_epi16(c, load256(reinterpret_cast<const uint8_t*>(qx + 32 * i))), ones));
  }
  const Act a{qx, dx, dxs, off.data(), K, G};
  constexpr int64_t MB = 16;
  const int64_t chunk = std::max<int64_t>(4, (int64_t(48) * 1024 / RB) / 4 * 4);
  at::parallel_for(0, (N + chunk - 1) / chunk, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t n0 = c * chunk, n1 = std::min(N, n0 + chunk);
      for (int64_t mb = 0; mb < M; mb += MB)
        for (int64_t t0 = n0; t0 < n1; t0 += NT_I8)
          rows_i8<W>(a, wp + t0 * RB, RB, mb, std::min(M, mb + MB), std::min<int64_t>(NT_I8, n1 - t0), t0, N, op);
    }
  });
}

// A group's exact int32 lane sums t32 of rows m0..m0+MT-1 (the 8 weight rows of an interleaved tile at b) into the
// fp32 accumulators: less OFF * sum(qx) for the offset types, acc = fma(fp32(sum), d_rows * dx, acc), and the min
// term accm = fma(m_rows, dx * sum(qx), accm) beside it.  tile_x8 and tile_x8_vnni share it: one fp32 chain.
template <class T, int MT>
__attribute__((always_inline)) inline void x8_accumulate(const Act& a, const int32_t* offs, const uint8_t* b,
                                                         int64_t g, int64_t m0, const __m256i* t32, __m256* acc,
                                                         __m256* accm) {
  const __m256 sv = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b)));
  for (int i = 0; i < MT; ++i) {
    const int64_t r = m0 + i;
    __m256i p = t32[i];
    if (T::off) p = _mm256_sub_epi32(p, _mm256_set1_epi32(offs[r * a.G + g]));
    acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(sv, _mm256_set1_ps(a.d[r * a.G + g])), acc[i]);
    if (T::min) {
      const __m256 mm = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 16)));
      accm[i] = _mm256_fmadd_ps(mm, _mm256_set1_ps(a.ds[r * a.G + g]), accm[i]);
    }
  }
}

// Activation rows m0..m0+MT-1 against one tile of an interleaved form (8 weight rows, lanes 0..7): per group, the
// exact int32 sums of the 8 rows (int16 pair sums of CH16 chunks added before each madd: no overflow, see X8), less
// OFF * sum(qx) for the offset types, then acc = fma(fp32(sum), d_rows * dx, acc) over the groups in order; the min
// term accm = fma(m_rows, dx * sum(qx), accm) beside it; out = acc (+ accm).  Each lane is one (row, weight row)
// chain whatever MT or the call: batch-invariant.
template <class T, int MT>
inline void tile_x8(const Act& a, const int32_t* offs, const uint8_t* w, int64_t m0, float* out) {
  __m256 acc[MT], accm[MT];
  for (int i = 0; i < MT; ++i) { acc[i] = _mm256_setzero_ps(); accm[i] = _mm256_setzero_ps(); }
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t g = 0; g < a.G; ++g) {
    const uint8_t* b = w + g * T::gbytes;
    __m256i t32[MT];
    for (int h = 0; h < 8 / T::ch16; ++h) {
      __m256i t16[MT];
      for (int i = 0; i < MT; ++i) t16[i] = _mm256_setzero_si256();
      for (int c = h * T::ch16; c < (h + 1) * T::ch16; ++c) {
        const __m256i wv = T::chunk(b, c);
        const __m256i uw = T::sign ? _mm256_sign_epi8(wv, wv) : wv;
        for (int i = 0; i < MT; ++i) {
          int32_t xs;
          std::memcpy(&xs, a.q + (m0 + i) * a.K + 32 * g + 4 * c, 4);
          __m256i xv = _mm256_set1_epi32(xs);
          if (T::sign) xv = _mm256_sign_epi8(xv, wv);
          const __m256i p16 = _mm256_maddubs_epi16(uw, xv);
          t16[i] = T::ch16 == 1 ? p16 : _mm256_add_epi16(t16[i], p16);
        }
      }
      for (int i = 0; i < MT; ++i) {
        const __m256i p = _mm256_madd_epi16(t16[i], ones);
        t32[i] = h == 0 ? p : _mm256_add_epi32(t32[i], p);
      }
    }
    x8_accumulate<T, MT>(a, offs, b, g, m0, t32, acc, accm);
  }
  for (int i = 0; i < MT; ++i) _mm256_storeu_ps(out + 8 * i, T::min ? _mm256_add_ps(acc[i], accm[i]) : acc[i]);
}

// tile_x8 where the CPU has AVX-512 VNNI (on 256-bit registers): each chunk's four products per lane go straight
// into the int32 lane with one vpdpbusd (unsigned x signed, exact: no int16 step to saturate), instead of maddubs
// into int16 pairs, their sums and a madd.  Q8_0's signed q goes in as q + 128 (one xor per chunk for every row,
// instead of the sign trick's two sign ops per row), less 128 * sum(qx) per group (``sums``).  The same exact int32
// group sums, then the same fp32 chain in the same order: bit for bit tile_x8's result (tests/test_gguf.py).
#define MICROSPEC_VNNI __attribute__((target("avx512f,avx512vl,avx512bw,avx512vnni")))
template <class T, int MT>
MICROSPEC_VNNI void tile_x8_vnni(const Act& a, const int32_t* offs, const int32_t* sums, const uint8_t* w,
                                 int64_t m0, float* out) {
  __m256 acc[MT], accm[MT];
  for (int i = 0; i < MT; ++i) { acc[i] = _mm256_setzero_ps(); accm[i] = _mm256_setzero_ps(); }
  for (int64_t g = 0; g < a.G; ++g) {
    const uint8_t* b = w + g * T::gbytes;
    __m256i t32[MT];
    for (int i = 0; i < MT; ++i) t32[i] = _mm256_setzero_si256();
    for (int c = 0; c < 8; ++c) {
      const __m256i wv = T::chunk(b, c);
      const __m256i uw = T::sign ? _mm256_xor_si256(wv, _mm256_set1_epi8(char(0x80))) : wv;  // q + 128
      for (int i = 0; i < MT; ++i) {
        int32_t xs;
        std::memcpy(&xs, a.q + (m0 + i) * a.K + 32 * g + 4 * c, 4);
        t32[i] = _mm256_dpbusd_epi32(t32[i], uw, _mm256_set1_epi32(xs));
      }
    }
    if (T::sign)  // the q + 128 of the products: less 128 * sum(qx)
      for (int i = 0; i < MT; ++i)
        t32[i] = _mm256_sub_epi32(t32[i], _mm256_set1_epi32(128 * sums[(m0 + i) * a.G + g]));
    x8_accumulate<T, MT>(a, offs, b, g, m0, t32, acc, accm);
  }
  for (int i = 0; i < MT; ++i) _mm256_storeu_ps(out + 8 * i, T::min ? _mm256_add_ps(acc[i], accm[i]) : acc[i]);
}

// Whether the interleaved products take tile_x8_vnni and tile_k8_vnni: -1 until first asked (then whether the CPU
// has AVX-512 VNNI with 256-bit registers), or as set_vnni set it.
std::atomic<int> g_vnni{-1};

bool cpu_has_vnni() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni");
}

bool vnni_on() {
  int v = g_vnni.load(std::memory_order_relaxed);
  if (v < 0) {
    v = cpu_has_vnni() ? 1 : 0;
    g_vnni.store(v, std::memory_order_relaxed);
  }
  return v == 1;
}

// A K-quant group's exact int32 lane sums t32 (scales applied) of rows m0..m0+MT-1 into the fp32 accumulators:
// Q6_K less 32 (sc_a * sum(qx[0..15]) + sc_b * sum(qx[16..31])), acc = fma(fp32(t32), d_rows * dx, acc), and Q4_K's
// min term accm = fnma(dmin_rows * m, dx * sum(qx), accm).  ``sx``: the group's scale pairs (see tile_k8).
// tile_k8 and tile_k8_vnni share it: one fp32 chain.
template <class T, int MT>
__attribute__((always_inline)) inline void k8_accumulate(const Act& a, const int32_t* offs, int64_t g, int64_t m0,
                                                         __m256i sx, __m256 dv, __m256 dminv, const __m256i* t32,
                                                         __m256* acc, __m256* accm) {
  constexpr bool Q6 = T::kq == 14;
  const __m256 mf = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(sx, 16)), dminv);  // Q4_K: dmin * m
  for (int i = 0; i < MT; ++i) {
    const int64_t r = m0 + i;
    __m256i p = t32[i];
    if (Q6)  // - 32 (sc_a * sum(qx[0..15]) + sc_b * sum(qx[16..31]))
      p = _mm256_sub_epi32(p, _mm256_slli_epi32(_mm256_madd_epi16(sx, _mm256_set1_epi32(offs[r * a.G + g])), 5));
    acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(dv, _mm256_set1_ps(a.d[r * a.G + g])), acc[i]);
    if (T::min) accm[i] = _mm256_fnmadd_ps(mf, _mm256_set1_ps(a.ds[r * a.G + g]), accm[i]);
  }
}

// Activation rows m0..m0+MT-1 against one tile-block row of a K-quant's interleaved form (XQ4_K, XQ6_K): per group,
// the int16 pair sums of chunks (8 for Q4_K, 2 for Q6_K) go through madd with the lanes' sub-block scales (sc, sc),
// so t32 = sum over the group of sc * q * qx, exactly; Q6_K subtracts 32 * (sc_a * sum(qx of elements 0..15) +
// sc_b * sum(qx of 16..31)), the offset of its q - 32 (offs: those two sums as an int16 pair per row and group);
// then acc = fma(fp32(t32), d_rows * dx, acc) over the groups in order, and for Q4_K the min term
// accm = fnma(dmin_rows * m, dx * sum(qx), accm) beside it.  One lane per (row, weight row): batch-invariant.
template <class T, int MT>
inline void tile_k8(const Act& a, const int32_t* offs, const uint8_t* w, int64_t m0, float* out) {
  constexpr bool Q6 = T::kq == 14;
  __m256 acc[MT], accm[MT];
  for (int i = 0; i < MT; ++i) { acc[i] = _mm256_setzero_ps(); accm[i] = _mm256_setzero_ps(); }
  const __m256i hi16 = _mm256_set1_epi32(int32_t(0xFFFF0000u));
  for (int64_t blk = 0; blk < a.G / 8; ++blk) {
    const uint8_t* B = w + blk * T::tbytes;
    const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(B)));
    const __m256 dminv = T::min ? _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(B + 16)))
                                : _mm256_setzero_ps();
    for (int j = 0; j < 8; ++j) {
      const int64_t g = blk * 8 + j;
      const __m128i sb = _mm_loadu_si128(reinterpret_cast<const __m128i*>(B + T::soff + 16 * j));
      // lane s: the int16 pair (byte 2s, byte 2s + 1): Q4_K (sc, m) unsigned, Q6_K (sc_a, sc_b) signed
      const __m256i sx = Q6 ? _mm256_cvtepi8_epi16(sb) : _mm256_cvtepu8_epi16(sb);
      const __m256i sa = _mm256_slli_epi32(sx, 16);
      const __m256i pa = _mm256_or_si256(sa, _mm256_srli_epi32(sa, 16));  // (sc_a, sc_a)
      const __m256i hb = _mm256_and_si256(sx, hi16);
      const __m256i pb = _mm256_or_si256(hb, _mm256_srli_epi32(hb, 16));  // Q6_K: (sc_b, sc_b)
      const uint8_t* q = B + T::qoff + T::qbytes * j;
      constexpr int CH16 = Q6 ? 2 : 8;
      __m256i t32[MT];
      for (int h = 0; h < 8 / CH16; ++h) {
        __m256i t16[MT];
        for (int i = 0; i < MT; ++i) t16[i] = _mm256_setzero_si256();
        for (int c = h * CH16; c < (h + 1) * CH16; ++c) {
          const __m256i wv = T::chunk(q, c);
          for (int i = 0; i < MT; ++i) {
            int32_t xs;
            std::memcpy(&xs, a.q + (m0 + i) * a.K + 32 * g + 4 * c, 4);
            t16[i] = _mm256_add_epi16(t16[i], _mm256_maddubs_epi16(wv, _mm256_set1_epi32(xs)));
          }
        }
        for (int i = 0; i < MT; ++i) {
          const __m256i p = _mm256_madd_epi16(t16[i], Q6 && h >= 2 ? pb : pa);
          t32[i] = h == 0 ? p : _mm256_add_epi32(t32[i], p);
        }
      }
      k8_accumulate<T, MT>(a, offs, g, m0, sx, dv, dminv, t32, acc, accm);
    }
  }
  for (int i = 0; i < MT; ++i) _mm256_storeu_ps(out + 8 * i, T::min ? _mm256_add_ps(acc[i], accm[i]) : acc[i]);
}

// tile_k8 with AVX-512 VNNI: each chunk's products go into int32 lanes with one vpdpbusd (the whole group for Q4_K,
// each half for Q6_K), times the lanes' sub-block scales with one mullo: the same exact int32 t32 as madd of the
// int16 pair sums with (sc, sc), so the same results bit for bit.
template <class T, int MT>
MICROSPEC_VNNI void tile_k8_vnni(const Act& a, const int32_t* offs, const uint8_t* w, int64_t m0, float* out) {
  constexpr bool Q6 = T::kq == 14;
  __m256 acc[MT], accm[MT];
  for (int i = 0; i < MT; ++i) { acc[i] = _mm256_setzero_ps(); accm[i] = _mm256_setzero_ps(); }
  for (int64_t blk = 0; blk < a.G / 8; ++blk) {
    const uint8_t* B = w + blk * T::tbytes;
    const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(B)));
    const __m256 dminv = T::min ? _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(B + 16)))
                                : _mm256_setzero_ps();
    for (int j = 0; j < 8; ++j) {
      const int64_t g = blk * 8 + j;
      const __m128i sb = _mm_loadu_si128(reinterpret_cast<const __m128i*>(B + T::soff + 16 * j));
      // lane s: the int16 pair (byte 2s, byte 2s + 1): Q4_K (sc, m) unsigned, Q6_K (sc_a, sc_b) signed
      const __m256i sx = Q6 ? _mm256_cvtepi8_epi16(sb) : _mm256_cvtepu8_epi16(sb);
      const uint8_t* q = B + T::qoff + T::qbytes * j;
      // exact int32 sums per lane: the whole group (Q4_K) or its halves (Q6_K), then times the lanes' scales
      __m256i s0[MT], s1[MT];
      for (int i = 0; i < MT; ++i) { s0[i] = _mm256_setzero_si256(); s1[i] = _mm256_setzero_si256(); }
      for (int c = 0; c < 8; ++c) {
        const __m256i wv = T::chunk(q, c);
        for (int i = 0; i < MT; ++i) {
          int32_t xs;
          std::memcpy(&xs, a.q + (m0 + i) * a.K + 32 * g + 4 * c, 4);
          if (Q6 && c >= 4) s1[i] = _mm256_dpbusd_epi32(s1[i], wv, _mm256_set1_epi32(xs));
          else s0[i] = _mm256_dpbusd_epi32(s0[i], wv, _mm256_set1_epi32(xs));
        }
      }
      // Q4_K: sc, the low int16 of the lane (unsigned); Q6_K: sc_a (low) and sc_b (high), signed
      const __m256i sca = Q6 ? _mm256_srai_epi32(_mm256_slli_epi32(sx, 16), 16)
                             : _mm256_and_si256(sx, _mm256_set1_epi32(0xFFFF));
      const __m256i scb = _mm256_srai_epi32(sx, 16);
      __m256i t32[MT];
      for (int i = 0; i < MT; ++i) {
        t32[i] = _mm256_mullo_epi32(s0[i], sca);
        if (Q6) t32[i] = _mm256_add_epi32(t32[i], _mm256_mullo_epi32(s1[i], scb));
      }
      k8_accumulate<T, MT>(a, offs, g, m0, sx, dv, dminv, t32, acc, accm);
    }
  }
  for (int i = 0; i < MT; ++i) _mm256_storeu_ps(out + 8 * i, T::min ? _mm256_add_ps(acc[i], accm[i]) : acc[i]);
}

template <class T, int MT>
inline void tile_any(const Act& a, const int32_t* offs, const int32_t* sums, const uint8_t* w, int64_t m0,
                     float* out, bool vnni) {
  if constexpr (T::kq != 0) {
    if (vnni) tile_k8_vnni<T, MT>(a, offs, w, m0, out);
    else tile_k8<T, MT>(a, offs, w, m0, out);
  } else if (vnni) tile_x8_vnni<T, MT>(a, offs, sums, w, m0, out);
  else tile_x8<T, MT>(a, offs, w, m0, out);
}

// The integer product with an interleaved form: tiles in chunks of ~48 KiB (L2), the input rows in blocks of 16
// and register tiles of up to 4 rows (each tile unpacks the weights it multiplies); every weight byte comes from
// memory once per call.
template <class T>
void linear_x8_type(const int8_t* qx, const float* dx, const float* dxs, int64_t M, int64_t K, const uint8_t* wp,
                    int64_t tiles, int64_t RB, float* op) {
  const int64_t G = K / 32, N = tiles * 8;
  std::vector<int32_t> offs(T::off ? M * G : 0);
  for (int64_t i = 0; T::off && i < M * G; ++i) {  // per row and group: OFF * sum(qx); Q6_K: the halves' sums
    int32_t lo = 0, hi = 0;
    for (int k = 0; k < 16; ++k) { lo += qx[32 * i + k]; hi += qx[32 * i + 16 + k]; }
    offs[i] = T::kq == 14 ? int32_t((uint32_t(lo) & 0xFFFFu) | (uint32_t(hi) << 16)) : T::off * (lo + hi);
  }
  const Act a{qx, dx, dxs, nullptr, K, G};
  const bool vnni = vnni_on();
  std::vector<int32_t> sums(vnni && T::kq == 0 && T::sign ? M * G : 0);  // per row and group: sum(qx)
  for (int64_t i = 0; i < int64_t(sums.size()); ++i) {
    int32_t v = 0;
    for (int k = 0; k < 32; ++k) v += qx[32 * i + k];
    sums[i] = v;
  }
  constexpr int64_t MB = 16;
  const int64_t chunk = std::max<int64_t>(1, int64_t(48) * 1024 / RB);
  at::parallel_for(0, (tiles + chunk - 1) / chunk, 1, [&](int64_t c0, int64_t c1) {
    float buf[4 * 8];
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t t0 = c * chunk, t1 = std::min(tiles, t0 + chunk);
      for (int64_t mb = 0; mb < M; mb += MB) {
        const int64_t me = std::min(M, mb + MB);
        for (int64_t t = t0; t < t1; ++t)
          for (int64_t m0 = mb; m0 < me; m0 += 4) {
            const int64_t mt = std::min<int64_t>(4, me - m0);
            const uint8_t* wt = wp + t * RB;
            switch (mt) {
              case 4: tile_any<T, 4>(a, offs.data(), sums.data(), wt, m0, buf, vnni); break;
              case 3: tile_any<T, 3>(a, offs.data(), sums.data(), wt, m0, buf, vnni); break;
              case 2: tile_any<T, 2>(a, offs.data(), sums.data(), wt, m0, buf, vnni); break;
              default: tile_any<T, 1>(a, offs.data(), sums.data(), wt, m0, buf, vnni); break;
            }
            for (int64_t i = 0; i < mt; ++i) std::memcpy(op + (m0 + i) * N + 8 * t, buf + 8 * i, 8 * sizeof(float));
          }
      }
    }
  });
}

}  // namespace

bool set_vnni(int64_t on) {
  g_vnni.store(on < 0 ? (cpu_has_vnni() ? 1 : 0) : (on && cpu_has_vnni() ? 1 : 0), std::memory_order_relaxed);
  return vnni_on();
}

// x: [M, K] fp32 contiguous; w: [N, row_bytes] uint8, each row K elements of GGML type `type`.  Returns [M, N] fp32.
torch::Tensor linear_q(torch::Tensor x, torch::Tensor w, int64_t type, int64_t K) {
  TORCH_CHECK(x.dtype() == torch::kFloat32 && x.is_contiguous() && x.dim() == 2 && x.size(1) == K,
              "x: contiguous fp32 [M, K]");
  TORCH_CHECK(w.dtype() == torch::kUInt8 && w.dim() == 2 && w.stride(1) == 1, "w: uint8 [N, row bytes]");
  const WLayout wl = layout(w, type, K);
  const int64_t M = x.size(0), N = wl.N, RB = w.stride(0);
  auto out = torch::empty({M, N}, x.options());
  const float* xp = x.data_ptr<float>();
  const uint8_t* wp = w.data_ptr<uint8_t>();
  float* op = out.data_ptr<float>();
  constexpr int NT = 4;
  constexpr int64_t MB = 16;
  // Chunks of weight rows whose fp32 unpacking fits in ~96 KiB (L2), 4 rows per register tile.  Inside a chunk the
  // input rows go in blocks of MB, 2 rows per tile: every weight block is read and unpacked once per call.
  const int64_t chunk = std::max<int64_t>(NT, (int64_t(96) * 1024 / (K * 4)) / NT * NT);
  at::parallel_for(0, (N + chunk - 1) / chunk, 1, [&](int64_t c0, int64_t c1) {
    std::vector<float> wb(chunk * K);
    float buf[2 * NT];
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t n0 = c * chunk, n1 = std::min(N, n0 + chunk);
      for (int64_t n = n0; n < n1; ++n) unpack_row(wl, wp, RB, n, K, wb.data() + (n - n0) * K);
      for (int64_t mb = 0; mb < M; mb += MB) {
        const int64_t me = std::min(M, mb + MB);
        for (int64_t t0 = n0; t0 < n1; t0 += NT) {
          const int64_t nt = std::min<int64_t>(NT, n1 - t0);
          const float* wt = wb.data() + (t0 - n0) * K;
          for (int64_t m0 = mb; m0 < me; m0 += 2) {
            const int64_t mt = std::min<int64_t>(2, me - m0);
            if (nt == NT) {
              if (mt == 2) tile<2, NT>(xp, K, wt, m0, buf);
              else tile<1, NT>(xp, K, wt, m0, buf);
            } else {
              for (int64_t j = 0; j < nt; ++j) {
                float one[2];
                if (mt == 2) tile<2, 1>(xp, K, wt + j * K, m0, one);
                else tile<1, 1>(xp, K, wt + j * K, m0, one);
                for (int64_t i = 0; i < mt; ++i) buf[i * NT + j] = one[i];
              }
            }
            for (int64_t i = 0; i < mt; ++i)
              for (int64_t j = 0; j < nt; ++j) op[(m0 + i) * N + t0 + j] = buf[i * NT + j];
          }
        }
      }
    }
  });
  return out;
}

torch::Tensor linear_q8(torch::Tensor x, torch::Tensor w, int64_t type, int64_t K) {
  TORCH_CHECK(x.dtype() == torch::kFloat32 && x.is_contiguous() && x.dim() == 2 && x.size(1) == K && K % 32 == 0,
              "x: contiguous fp32 [M, K], K a multiple of 32");
  TORCH_CHECK(w.dtype() == torch::kUInt8 && w.dim() == 2 && w.stride(1) == 1, "w: uint8 [N, row bytes]");
  const int64_t M = x.size(0), N = layout(w, type, K).N, RB = w.stride(0), G = K / 32;
  auto out = torch::empty({M, N}, x.options());
  std::vector<int8_t> qx(M * K);
  std::vector<float> dx(M * G), dxs(M * G);
  const float* xp = x.data_ptr<float>();
  for (int64_t m = 0; m < M; ++m) quant_row(xp + m * K, K, qx.data() + m * K, dx.data() + m * G, dxs.data() + m * G);
  const uint8_t* wp = w.data_ptr<uint8_t>();
  float* op = out.data_ptr<float>();
  auto run = [&](auto tag) {
    linear_q8_type<decltype(tag)>(qx.data(), dx.data(), dxs.data(), M, K, wp, N, RB, op);
  };
  auto run_x8 = [&](auto tag) {
    linear_x8_type<decltype(tag)>(qx.data(), dx.data(), dxs.data(), M, K, wp, w.size(0), RB, op);
  };
  switch (type) {
    case 1008: run_x8(XQ8_0{}); break;
    case 1002: run_x8(XQ4_0{}); break;
    case 1003: run_x8(XQ4_1{}); break;
    case 1006: run_x8(XQ5_0{}); break;
    case 1007: run_x8(XQ5_1{}); break;
    case 1012: run_x8(XQ4_K{}); break;
    case 1014: run_x8(XQ6_K{}); break;
    case 8: run(WQ8_0{}); break;
    case 2: run(WQ4_0{}); break;
    case 3: run(WQ4_1{}); break;
    case 6: run(WQ5_0{}); break;
    case 7: run(WQ5_1{}); break;
    case 12: run(WQ4_K{}); break;
    case 13: run(WQ5_K{}); break;
    case 14: run(WQ6_K{}); break;
    default: TORCH_CHECK(false, "GGML type ", type, " has no integer path");
  }
  return out;
}
