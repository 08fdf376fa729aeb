// Products with packed GGUF weights, y = x W^T: linear_q on fp32 activations (a chunk of weight rows unpacked to
// fp32 in L2, then the register tiles of common.h) and linear_q8, the integer path (activations quantized to int8
// per 32-element block, exact int32 group sums) on the file's blocks; the interleaved forms' products are in
// linear_x8.cpp.
#include "blocks.h"
#include "int8.h"
#include "quant.h"

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
    __m256i q[4];
    for (int g = 0; g < 4; ++g)
      q[g] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(xb + 8 * g), _mm256_set1_ps(id)),
                                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    // |q| <= 127: the saturating packs keep every value; they interleave the four vectors by 4-lane halves, which
    // the permutation puts back in order
    const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(qx + 32 * b),
                        _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    const __m256i s8 = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
    const int sum = _mm_cvtsi128_si32(s4);
    dx[b] = d;
    dxs[b] = d * float(sum);
  }
}



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


}  // namespace

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

namespace {

void check_q8_input(const torch::Tensor& x, int64_t K) {
  TORCH_CHECK(x.dtype() == torch::kFloat32 && x.is_contiguous() && x.dim() == 2 && x.size(1) == K && K % 32 == 0,
              "x: contiguous fp32 [M, K], K a multiple of 32");
}

void check_q8_weight(const torch::Tensor& w) {
  TORCH_CHECK(w.dtype() == torch::kUInt8 && w.dim() == 2 && w.stride(1) == 1, "w: uint8 [N, row bytes]");
}

// The rows of x [M, K] quantized for the integer path (see quant_row)
struct QRows {
  std::vector<int8_t> q;
  std::vector<float> d, ds;
  QRows(const torch::Tensor& x, int64_t K) : q(x.size(0) * K), d(x.size(0) * (K / 32)), ds(x.size(0) * (K / 32)) {
    const float* xp = x.data_ptr<float>();
    const int64_t G = K / 32;
    for (int64_t m = 0; m < x.size(0); ++m)
      quant_row(xp + m * K, K, q.data() + m * K, d.data() + m * G, ds.data() + m * G);
  }
};

}  // namespace

torch::Tensor linear_q8(torch::Tensor x, torch::Tensor w, int64_t type, int64_t K, int64_t plan) {
  check_q8_input(x, K);
  check_q8_weight(w);
  const int64_t M = x.size(0), N = layout(w, type, K).N, RB = w.stride(0);
  auto out = torch::empty({M, N}, x.options());
  const QRows qr(x, K);
  const uint8_t* wp = w.data_ptr<uint8_t>();
  float* op = out.data_ptr<float>();
  auto run = [&](auto tag) {
    linear_q8_type<decltype(tag)>(qr.q.data(), qr.d.data(), qr.ds.data(), M, K, wp, N, RB, op);
  };
  if (type > 1000) {
    microspec::linear_x8(type, qr.q.data(), qr.d.data(), qr.ds.data(), M, K, wp, w.size(0), RB, op,
                         microspec::Plan::of(plan));
    return out;
  }
  switch (type) {
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

// linear_q8 of the same x by several matrices: x quantized once, and where every matrix is an interleaved form their
// products run in one parallel region (linear_x8_many); otherwise one linear_q8 each.  The same values as
// linear_q8 of each, bit for bit.
std::vector<torch::Tensor> linear_q8_many(torch::Tensor x, std::vector<torch::Tensor> ws, std::vector<int64_t> types,
                                          int64_t K, int64_t plan) {
  TORCH_CHECK(ws.size() == types.size(), "linear_q8_many: one type per matrix");
  check_q8_input(x, K);
  const bool interleaved = std::all_of(types.begin(), types.end(), [](int64_t t) { return t > 1000; });
  std::vector<torch::Tensor> outs;
  if (!interleaved) {
    for (size_t j = 0; j < ws.size(); ++j) outs.push_back(linear_q8(x, ws[j], types[j], K, plan));
    return outs;
  }
  const int64_t M = x.size(0);
  std::vector<microspec::X8Job> jobs;
  for (size_t j = 0; j < ws.size(); ++j) {
    check_q8_weight(ws[j]);
    const int64_t N = layout(ws[j], types[j], K).N;
    outs.push_back(torch::empty({M, N}, x.options()));
    jobs.push_back(
        {types[j], ws[j].data_ptr<uint8_t>(), ws[j].size(0), ws[j].stride(0), outs.back().data_ptr<float>()});
  }
  const QRows qr(x, K);
  microspec::linear_x8_many(jobs, qr.q.data(), qr.d.data(), qr.ds.data(), M, K, microspec::Plan::of(plan));
  return outs;
}
