// GGUF blocks unpacked to fp32: each block type exactly as the gguf package's dequantize computes it (the same
// products and sums in the same order; built with -ffp-contract=off), the interleaved forms' rows with the same
// values, and dequant_rows (rows of a packed matrix, e.g. the embedding lookup).
#include "blocks.h"
#include "quant.h"

namespace {

// 8 unsigned bytes (the low 8 of v) as fp32 lanes
inline __m256 u8_ps(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)); }

// 32 elements whose low 4 bits are the nibbles of qs[16] (elements 0..15: low nibbles, 16..31: high nibbles) as
// four 8-byte groups of values 0..15.
inline void nibbles(const uint8_t* qs, __m128i& lo, __m128i& hi) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i m4 = _mm_set1_epi8(15);
  lo = _mm_and_si128(raw, m4);
  hi = _mm_and_si128(_mm_srli_epi16(raw, 4), m4);
}

// y[8] = d * (q - off) or (d * q) + m, as the gguf package computes them
inline void put_dq(float* y, __m256 q, __m256 d, __m256 off) { _mm256_storeu_ps(y, _mm256_mul_ps(d, _mm256_sub_ps(q, off))); }
inline void put_dm(float* y, __m256 q, __m256 d, __m256 m) { _mm256_storeu_ps(y, _mm256_add_ps(_mm256_mul_ps(d, q), m)); }

// Q4_0 (MIN = false: d * (q - 8)) and Q4_1 (MIN = true: d * q + m), blocks of 32 with 4-bit q
template <bool MIN>
void deq_q4(const uint8_t* b, float* y) {
  const __m256 d = _mm256_set1_ps(h2f(b)), c = _mm256_set1_ps(MIN ? h2f(b + 2) : 8.0f);
  auto put = [&](float* o, __m256 q) { if (MIN) put_dm(o, q, d, c); else put_dq(o, q, d, c); };
  __m128i lo, hi;
  nibbles(b + (MIN ? 4 : 2), lo, hi);
  put(y, u8_ps(lo)); put(y + 8, u8_ps(_mm_srli_si128(lo, 8)));
  put(y + 16, u8_ps(hi)); put(y + 24, u8_ps(_mm_srli_si128(hi, 8)));
}

// the 5th bits of elements e0..e0+7 of a Q5 block, as 0 or 16 per lane
inline __m256i fifth(uint32_t qh, int e0) {
  const __m256i sh = _mm256_add_epi32(_mm256_set1_epi32(e0), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  return _mm256_slli_epi32(_mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(int(qh)), sh), _mm256_set1_epi32(1)), 4);
}

inline __m256 q5_ps(__m128i low8, uint32_t qh, int e0) {
  return _mm256_cvtepi32_ps(_mm256_or_si256(_mm256_cvtepu8_epi32(low8), fifth(qh, e0)));
}

// Q5_0 (MIN = false: d * (q - 16)) and Q5_1 (MIN = true: d * q + m), blocks of 32 with 5-bit q
template <bool MIN>
void deq_q5(const uint8_t* b, float* y) {
  const __m256 d = _mm256_set1_ps(h2f(b)), c = _mm256_set1_ps(MIN ? h2f(b + 2) : 16.0f);
  auto put = [&](float* o, __m256 q) { if (MIN) put_dm(o, q, d, c); else put_dq(o, q, d, c); };
  uint32_t qh; std::memcpy(&qh, b + (MIN ? 4 : 2), 4);
  __m128i lo, hi;
  nibbles(b + (MIN ? 8 : 6), lo, hi);
  put(y, q5_ps(lo, qh, 0)); put(y + 8, q5_ps(_mm_srli_si128(lo, 8), qh, 8));
  put(y + 16, q5_ps(hi, qh, 16)); put(y + 24, q5_ps(_mm_srli_si128(hi, 8), qh, 24));
}

void deq_q8_0(const uint8_t* b, float* y) {
  const __m256 d = _mm256_set1_ps(h2f(b));
  for (int g = 0; g < 4; ++g) {
    const __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 2 + 8 * g));
    _mm256_storeu_ps(y + 8 * g, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)), d));
  }
}

// y[32] = (d*sc) * q - (dmin*m) for the 32 values q (as fp32) of groups g0..g3
inline void put_k(float* y, const __m256* q, float dsc, float dm) {
  const __m256 a = _mm256_set1_ps(dsc), c = _mm256_set1_ps(dm);
  for (int g = 0; g < 4; ++g) _mm256_storeu_ps(y + 8 * g, _mm256_sub_ps(_mm256_mul_ps(a, q[g]), c));
}

void deq_q4_k(const uint8_t* b, float* y) {
  const float d = h2f(b), dmin = h2f(b + 2);
  const uint8_t* sc = b + 4;
  const uint8_t* qs = b + 16;
  for (int c = 0; c < 4; ++c) {  // 32 bytes: sub-block 2c in the low nibbles, 2c+1 in the high ones
    __m128i lo0, hi0, lo1, hi1;
    nibbles(qs + 32 * c, lo0, hi0);        // bytes 0..15
    nibbles(qs + 32 * c + 16, lo1, hi1);   // bytes 16..31
    for (int h = 0; h < 2; ++h) {
      const __m128i a = h ? hi0 : lo0, bb = h ? hi1 : lo1;
      __m256 q[4] = {u8_ps(a), u8_ps(_mm_srli_si128(a, 8)), u8_ps(bb), u8_ps(_mm_srli_si128(bb, 8))};
      int s, m;
      scale_min_k4(sc, 2 * c + h, s, m);
      put_k(y + 64 * c + 32 * h, q, d * float(s), dmin * float(m));
    }
  }
}

void deq_q5_k(const uint8_t* b, float* y) {
  const float d = h2f(b), dmin = h2f(b + 2);
  const uint8_t* sc = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* qs = b + 48;
  for (int c = 0; c < 4; ++c) {
    __m128i lo0, hi0, lo1, hi1;
    nibbles(qs + 32 * c, lo0, hi0);
    nibbles(qs + 32 * c + 16, lo1, hi1);
    for (int h = 0; h < 2; ++h) {
      const int sub = 2 * c + h;
      const __m128i a = h ? hi0 : lo0, bb = h ? hi1 : lo1;
      const __m128i hb0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qh));
      const __m128i hb1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qh + 16));
      const __m128i one = _mm_set1_epi8(1);
      // bit `sub` of qh[p] << 4, for p in 0..15 and 16..31
      const __m128i f0 = _mm_slli_epi16(_mm_and_si128(_mm_srl_epi16(hb0, _mm_cvtsi32_si128(sub)), one), 4);
      const __m128i f1 = _mm_slli_epi16(_mm_and_si128(_mm_srl_epi16(hb1, _mm_cvtsi32_si128(sub)), one), 4);
      const __m128i v0 = _mm_or_si128(a, f0), v1 = _mm_or_si128(bb, f1);
      __m256 q[4] = {u8_ps(v0), u8_ps(_mm_srli_si128(v0, 8)), u8_ps(v1), u8_ps(_mm_srli_si128(v1, 8))};
      int s, m;
      scale_min_k4(sc, sub, s, m);
      put_k(y + 32 * sub, q, d * float(s), dmin * float(m));
    }
  }
}

void deq_q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* scales = reinterpret_cast<const int8_t*>(b + 192);
  const float d = h2f(b + 208);
  const __m256 off = _mm256_set1_ps(32.0f);
  // element e = h*128 + s*64 + p (p < 64): low bits = nibble s of ql[h*64 + p], high bits = bits 2*(2s + p/32) of
  // qh[h*32 + p%32]; scale scales[e / 16]
  for (int h = 0; h < 2; ++h)
    for (int s = 0; s < 2; ++s)
      for (int p = 0; p < 64; p += 8) {
        const __m128i l = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(ql + h * 64 + p));
        const __m128i lv = s ? _mm_and_si128(_mm_srli_epi16(l, 4), _mm_set1_epi8(15)) : _mm_and_si128(l, _mm_set1_epi8(15));
        const __m128i hb = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(qh + h * 32 + (p % 32)));
        const int shift = 2 * (2 * s + p / 32);
        const __m128i hv = _mm_slli_epi16(_mm_and_si128(_mm_srl_epi16(hb, _mm_cvtsi32_si128(shift)), _mm_set1_epi8(3)), 4);
        const __m256 q = _mm256_sub_ps(u8_ps(_mm_or_si128(lv, hv)), off);
        const int e = h * 128 + s * 64 + p;
        const __m256 dv = _mm256_set1_ps(d * float(scales[e / 16]));
        _mm256_storeu_ps(y + e, _mm256_mul_ps(dv, q));
      }
}

void deq_f32(const uint8_t* b, float* y) { std::memcpy(y, b, 4); }
void deq_f16(const uint8_t* b, float* y) { *y = h2f(b); }
void deq_bf16(const uint8_t* b, float* y) { uint32_t u = uint32_t(b[0] | (b[1] << 8)) << 16; std::memcpy(y, &u, 4); }

// Row n (of the matrix) of an interleaved form at w (tiles of RB bytes), unpacked to y[K] with the file's values
// (the same fp32 products as the packed blocks' unpacking)
void x8_row(const X8Info& x, const uint8_t* w, int64_t RB, int64_t n, int64_t K, float* y) {
  const uint8_t* t = w + (n / 8) * RB;
  const int s = int(n % 8);
  if (x.kq) {  // a K-quant, with the fp32 operations of deq_q4_k / deq_q6_k (the same values)
    for (int64_t b = 0; b < K / 256; ++b) {
      const uint8_t* tb = t + b * 8 * x.gbytes;
      const float d = h2f(tb + 2 * s);
      float* yb = y + 256 * b;
      for (int j = 0; j < 8; ++j) {
        if (x.kq == 12) {  // (d * sc) * q - (dmin * m)
          const float a = d * float(tb[32 + 16 * j + 2 * s]), c = h2f(tb + 16 + 2 * s) * float(tb[33 + 16 * j + 2 * s]);
          const uint8_t* q = tb + 160 + 128 * j;
          for (int k = 0; k < 32; ++k) {
            const uint8_t nb = q[x8_byte(s, k)];
            yb[32 * j + k] = a * float((k < 16 ? nb : nb >> 4) & 15) - c;
          }
          continue;
        }
        const uint8_t* q = tb + 144 + 192 * j;  // Q6_K: (d * sc) * (q - 32)
        for (int k = 0; k < 32; ++k) {
          const uint8_t nb = q[x8_byte(s, k)];
          const int v = ((k < 16 ? nb : nb >> 4) & 15) | (((q[k8_hi_byte(s, k)] >> k8_hi_shift(k)) & 3) << 4);
          const float a = d * float(int8_t(tb[16 + 16 * j + 2 * s + (k >> 4)]));
          yb[32 * j + k] = a * (float(v) - 32.0f);
        }
      }
    }
    return;
  }
  for (int64_t g = 0; g < K / 32; ++g) {
    const uint8_t* b = t + g * x.gbytes;
    const float d = h2f(b + 2 * s), m = x.min ? h2f(b + 16 + 2 * s) : 0.0f;
    if (x.q8) {  // as deq_q8_0: fp32(q) * d
      for (int k = 0; k < 32; ++k)
        y[32 * g + k] = float(int8_t(b[x.head + x8_chunk_byte(s, k)])) * d;
      continue;
    }
    for (int k = 0; k < 32; ++k) {
      const uint8_t nb = b[x.head + x8_byte(s, k)];
      int q = k < 16 ? (nb & 15) : (nb >> 4);
      if (x.q5) q |= ((b[x.head + x8_bit_byte(s, k)] >> (k >> 2)) & 1) << 4;
      y[32 * g + k] = x.min ? d * float(q) + m : d * (float(q) - float(x.off));
    }
  }
}

inline void deq_row(const QType& q, const uint8_t* row, int64_t K, float* y) {
  if (q.block == 1 && q.bytes == 4) { std::memcpy(y, row, K * 4); return; }
  if (q.block == 1 && q.bytes == 2 && q.deq == deq_f16) {
    int64_t k = 0;
    for (; k + 8 <= K; k += 8)
      _mm256_storeu_ps(y + k, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * k))));
    for (; k < K; ++k) y[k] = h2f(row + 2 * k);
    return;
  }
  for (int64_t k = 0, b = 0; k < K; k += q.block, b += q.bytes) q.deq(row + b, y + k);
}

}  // namespace

namespace microspec {

QType qtype(int64_t t) {
  switch (t) {
    case 0: return {1, 4, deq_f32};
    case 1: return {1, 2, deq_f16};
    case 2: return {32, 18, deq_q4<false>};
    case 3: return {32, 20, deq_q4<true>};
    case 6: return {32, 22, deq_q5<false>};
    case 7: return {32, 24, deq_q5<true>};
    case 8: return {32, 34, deq_q8_0};
    case 12: return {256, 144, deq_q4_k};
    case 13: return {256, 176, deq_q5_k};
    case 14: return {256, 210, deq_q6_k};
    case 30: return {1, 2, deq_bf16};
  }
  TORCH_CHECK(false, "unsupported GGML type ", t);
}

// A weight matrix w [data rows, row bytes] of `type` (a GGML type or an interleaved form), rows of K elements: its
// layout, checked, and its number of matrix rows N
WLayout layout(const torch::Tensor& w, int64_t type, int64_t K) {
  const X8Info xi = x8_info(type);
  const QType q = xi.ok ? QType{32, 0, nullptr} : qtype(type);
  TORCH_CHECK(K % (xi.kq ? 256 : q.block) == 0 && w.size(1) == (xi.ok ? K / 32 * xi.gbytes : K / q.block * q.bytes),
              "w's row bytes disagree with K and the type");
  return {xi, q, w.size(0) * (xi.ok ? 8 : 1)};
}

// Matrix row n of w (data rows of RB bytes) unpacked to y[K]
void unpack_row(const WLayout& l, const uint8_t* w, int64_t RB, int64_t n, int64_t K, float* y) {
  if (l.xi.ok) x8_row(l.xi, w, RB, n, K, y);
  else deq_row(l.q, w + n * RB, K, y);
}

}  // namespace microspec

// Rows `ids` of w, unpacked to fp32 [n, K] (the embedding lookup, packed draft buffers, dequantization).
torch::Tensor dequant_rows(torch::Tensor w, int64_t type, int64_t K, torch::Tensor ids) {
  TORCH_CHECK(w.dtype() == torch::kUInt8 && w.dim() == 2 && w.stride(1) == 1, "w: uint8 [N, row bytes]");
  TORCH_CHECK(ids.dtype() == torch::kLong && ids.dim() == 1, "ids: int64 [n]");
  const WLayout wl = layout(w, type, K);
  ids = ids.contiguous();
  const int64_t n = ids.size(0), N = wl.N, RB = w.stride(0);
  const int64_t* ip = ids.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) TORCH_CHECK(ip[i] >= 0 && ip[i] < N, "row id ", ip[i], " out of range");
  auto out = torch::empty({n, K}, torch::dtype(torch::kFloat32));
  const uint8_t* wp = w.data_ptr<uint8_t>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, n, 64, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) unpack_row(wl, wp, RB, ip[i], K, op + i * K);
  });
  return out;
}
