"""CPU products with GGUF-quantized weights kept packed: ``y = x W^T`` for W in its GGUF block format.

Why: a GGUF file is ~2x smaller than its bf16 dequantization (Gemma 3 270M: 247 MB against 536 MB; the tied Q8_0
embedding / LM head is 178 MB of it), and one decode step reads every weight once, so the packed bytes are the
bandwidth floor.  Each call walks the weight rows in chunks that fit in L2: a chunk's blocks are unpacked once into
fp32 (AVX2 + F16C, in the cache) and every input row of the call is multiplied against them (FMA, fp32 sums).  One
row streams the packed weights once; R rows (a verify pass) share that read and the unpacking.

Types: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K (GGML's layouts; what Gemma 3 270M's Q4_K_M
file and SmolLM2's Q4_1 file hold, and what common files use).  Another type is refused at load with one line.
Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K and Q6_K matrices whose rows come in eights are kept, by default, in an
interleaved form (:func:`repack`, as llama.cpp repacks for its CPU kernels): the same bits in the same bytes (Q4_K:
its 6-bit sub-block scales unpacked, 3% more), 8 rows' blocks side by side so that one integer multiply serves 8
rows and the scaling runs once per 8 rows (``*_X8`` types; the rows go back to the file's blocks where a subset is
taken: shortlists, draft heads).

Exactness: a block unpacks to exactly the fp32 values the ``gguf`` package's ``dequantize`` gives (same products
and sums in the same order, no fused multiply-add: ``-ffp-contract=off``).  On the fp32-activation path (``linear``)
every output element is the same fixed-order fp32 dot product as in :mod:`.cpu_linear` (8 lanes along K, fixed
horizontal sum, scalar tail); it differs from "dequantize with gguf, then fp32 matmul" only in the order of the fp32
sum (tests: relative error below 1e-5 of the row's magnitude).  On the integer path (``linear_q8``) each 32-element
group's product is an exact int32 sum, scaled and summed in fp32 in a fixed order: over 8 lanes then a horizontal
sum for the file's layout, one lane per row for the interleaved forms (so the two layouts differ by fp32 rounding).
Either way a row's result does not depend on the other rows of the call or where it falls in it: rows are
batch-invariant, so a tree-verify pass computes what the one-token step computes and greedy speculation is
bit-identical to greedy decoding on this path.
"""

from __future__ import annotations

import torch

from ._build import COMMON_CPP, Extension

# type name -> (GGML type id as in gguf.GGMLQuantizationType, block size in elements, bytes per block)
TYPES = {
    "F32": (0, 1, 4), "F16": (1, 1, 2), "Q4_0": (2, 32, 18), "Q4_1": (3, 32, 20), "Q5_0": (6, 32, 22),
    "Q5_1": (7, 32, 24), "Q8_0": (8, 32, 34), "Q4_K": (12, 256, 144), "Q5_K": (13, 256, 176),
    "Q6_K": (14, 256, 210), "BF16": (30, 1, 2),
    # interleaved forms (see repack): 8 rows' blocks together, the same bytes; not GGML types
    "Q4_0_X8": (1002, 32, 18), "Q4_1_X8": (1003, 32, 20), "Q5_0_X8": (1006, 32, 22), "Q5_1_X8": (1007, 32, 24),
    "Q8_0_X8": (1008, 32, 34),
    # the K-quants' (bytes per row and 256-block; Q4_K's scales unpacked to bytes: 148 against the file's 144)
    "Q4_K_X8": (1012, 256, 148), "Q6_K_X8": (1014, 256, 210),
}
TYPE_NAMES = {v[0]: k for k, v in TYPES.items()}
INTEGER_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K",
                 "Q4_0_X8", "Q4_1_X8", "Q5_0_X8", "Q5_1_X8", "Q8_0_X8", "Q4_K_X8", "Q6_K_X8")  # linear_q8 serves
INTERLEAVED = {"Q4_0": "Q4_0_X8", "Q4_1": "Q4_1_X8", "Q5_0": "Q5_0_X8", "Q5_1": "Q5_1_X8",
               "Q8_0": "Q8_0_X8", "Q4_K": "Q4_K_X8", "Q6_K": "Q6_K_X8"}  # file type -> its interleaved form
FILE_TYPE = {v: k for k, v in INTERLEAVED.items()}  # interleaved form -> the file type it holds
ROWS_PER_TILE = 8  # rows of an interleaved form held together

_SOURCE = COMMON_CPP + r"""
namespace {

inline float h2f(const uint8_t* p) { uint16_t h; std::memcpy(&h, p, 2); return _cvtsh_ss(h); }

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

// Q4_K / Q5_K: 8 sub-blocks of 32 with 6-bit scales and mins packed in 12 bytes
inline void scale_min_k4(const uint8_t* s, int j, int& sc, int& m) {
  if (j < 4) { sc = s[j] & 63; m = s[j + 4] & 63; }
  else { sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4); m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4); }
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

struct QType { int block; int bytes; void (*deq)(const uint8_t*, float*); };

void deq_f32(const uint8_t* b, float* y) { std::memcpy(y, b, 4); }
void deq_f16(const uint8_t* b, float* y) { *y = h2f(b); }
void deq_bf16(const uint8_t* b, float* y) { uint32_t u = uint32_t(b[0] | (b[1] << 8)) << 16; std::memcpy(y, &u, 4); }

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

// ---------------------------------------------------------------------------------------------------------------
// Interleaved forms (repack_x8): the rows of a Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 matrix in tiles of 8, the same bits in
// the same number of bytes, laid out so that one maddubs multiplies 8 rows (Q4_K and Q6_K: see XQ4_K below).  Per
// 32-element group g a tile holds:
//   - the 8 rows' fp16 scales d (16 bytes), then for the types with a minimum their 8 fp16 m (16 bytes);
//   - 4 nibble vectors of 32 bytes: in vector v, byte 4s + e holds row s's element 4v + e (low nibble) and element
//     16 + 4v + e (high nibble);
//   - for Q5_0 / Q5_1 a bit plane of 32 bytes: bit c of byte 4s + e is the 5th bit of row s's element 4c + e.
// "Chunk" c (c = 0..7) is then a 32-byte vector of 4 consecutive elements 4c..4c+3 of each of the 8 rows (row s at
// bytes 4s..4s+3), unsigned q; a row's weights are d * (q - OFF) (Q4_0: OFF 8, Q5_0: 16) or d * q + m: the file's
// values.  Against a broadcast of 4 activation bytes, maddubs + madd give 8 int32 lanes, one per row.
inline __m256i load256(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
// chunk c of the 4 nibble vectors at q: vector c % 4, its low nibbles for c < 4, its high ones for c >= 4
inline __m256i nib_chunk(const uint8_t* q, int c) {
  const __m256i v = load256(q + 32 * (c & 3));
  return _mm256_and_si256(c < 4 ? v : _mm256_srli_epi16(v, 4), _mm256_set1_epi8(15));
}

template <int OFF, bool MIN, bool Q5>
struct X8 {
  static constexpr int off = OFF, head = MIN ? 32 : 16, gbytes = head + 128 + (Q5 ? 32 : 0);
  static constexpr bool min = MIN, q5 = Q5, sign = false;
  // chunks whose maddubs pair sums (<= 2 x qmax x 127) add up in int16 without overflow: 8 for q <= 15, 4 for 31
  static constexpr int ch16 = Q5 ? 4 : 8;
  static constexpr int kq = 0;  // not a K-quant
  // chunk c of group b (b: the group's first byte)
  static inline __m256i chunk(const uint8_t* b, int c) {
    __m256i q = nib_chunk(b + head, c);
    if (Q5) {
      const __m256i hb = _mm256_and_si256(load256(b + head + 128), _mm256_set1_epi8(char(1 << c)));
      q = _mm256_or_si256(q, c < 4 ? _mm256_slli_epi16(hb, 4 - c) : c > 4 ? _mm256_srli_epi16(hb, c - 4) : hb);
    }
    return q;
  }
};
// Q8_0: 8 chunk vectors of 32 signed bytes after the scales (no nibbles); signed q go through the sign trick
// (|q| x sign(x, q)), whose pair sums (<= 2 x 127 x 127) leave no room to add chunks in int16.
struct XQ8_0 {
  static constexpr int off = 0, head = 16, gbytes = 16 + 256, ch16 = 1, kq = 0;
  static constexpr bool min = false, q5 = false, sign = true;  // sign: signed q (the sign trick)
  static inline __m256i chunk(const uint8_t* b, int c) { return load256(b + head + 32 * c); }
};
using XQ4_0 = X8<8, false, false>;
using XQ4_1 = X8<0, true, false>;
using XQ5_0 = X8<16, false, true>;
using XQ5_1 = X8<0, true, true>;

// Where element k (< 32) of row s of a group lives, counted from the group's first quant byte (after the scales):
// its byte in chunk k / 4 (Q8_0); its nibble's byte (the low nibble for k < 16, the high one for k >= 16); the byte
// of the 5th-bit plane after the nibble vectors (bit k / 4)
inline int x8_chunk_byte(int s, int k) { return 32 * (k >> 2) + 4 * s + (k & 3); }
inline int x8_byte(int s, int k) { return x8_chunk_byte(s, k & 15); }
inline int x8_bit_byte(int s, int k) { return 128 + 4 * s + (k & 3); }

// The K-quants interleaved (Q4_K, Q6_K): per 256-element block, a tile-block of the 8 rows' blocks (tbytes bytes):
//   - the 8 rows' fp16 d (16 bytes), for Q4_K then their 8 fp16 dmin (16 bytes);
//   - per 32-element group j (0..7), 16 bytes of the sub-block scales, row s at bytes 2s, 2s + 1:
//       Q4_K: sub-block j's 6-bit scale sc and min m, unpacked to a byte each (the file packs them in 12 bytes a row,
//             so a Q4_K tile-block holds 32 bytes more than the 8 file blocks: 1,184 against 1,152);
//       Q6_K: the int8 scales of the group's two 16-element sub-blocks 2j and 2j + 1 (the same 128 bytes);
//   - then per group j the quants as in X8: 4 nibble vectors (chunk c = elements 4c..4c+3 of the 8 rows), and for
//     Q6_K a plane of the high 2 bits: 2 vectors of 32 bytes, vector c / 4 holding chunk c's bits at bits 2 (c % 4)
//     (q = 0..63, weight d * sc * (q - 32)); a Q6_K tile-block is 1,680 bytes, 8 x 210.
// The sub-block scales go into the int32 sums as madd's multipliers (int16 pairs (sc, sc) per lane), so a group
// still needs one fp32 multiply-add per row: Q4_K's int16 pair sums of 8 chunks (<= 8 x 2 x 15 x 127) times sc
// (<= 63), Q6_K's of 2 chunks (<= 2 x 2 x 63 x 127 = 32,004) times |sc| <= 128, both far inside int32.
struct XQ4_K {
  static constexpr int off = 0, head = 0, gbytes = 148, kq = 12, tbytes = 1184, soff = 32, qoff = 160, qbytes = 128;
  static constexpr bool min = true, q5 = false, sign = false;
  static inline __m256i chunk(const uint8_t* q, int c) { return nib_chunk(q, c); }
};
struct XQ6_K {
  static constexpr int off = 32, head = 0, gbytes = 210, kq = 14, tbytes = 1680, soff = 16, qoff = 144, qbytes = 192;
  static constexpr bool min = false, q5 = false, sign = false;
  static inline __m256i chunk(const uint8_t* q, int c) {  // chunk c's 2 high bits moved to bits 4, 5 (one shift)
    const __m256i h = load256(q + 128 + 32 * (c >> 2)), m = _mm256_set1_epi8(0x30);
    const int b = c & 3;
    const __m256i hb = _mm256_and_si256(b == 0 ? _mm256_slli_epi16(h, 4) : b == 1 ? _mm256_slli_epi16(h, 2)
                                        : b == 2 ? h : _mm256_srli_epi16(h, 2), m);
    return _mm256_or_si256(nib_chunk(q, c), hb);
  }
};

// Row s's file block <-> its place in a K-quant tile-block tb (kq 12: Q4_K, 14: Q6_K)
inline int q6_get(const uint8_t* b, int e) {  // quant e (0..255) of a Q6_K file block, 0..63
  const int h = e / 128, r = e % 128, s = r / 64, p = r % 64;
  return ((b[h * 64 + p] >> (4 * s)) & 15) | (((b[128 + h * 32 + p % 32] >> (2 * (2 * s + p / 32))) & 3) << 4);
}
inline void q6_set(uint8_t* b, int e, int q) {  // into a zeroed Q6_K file block
  const int h = e / 128, r = e % 128, s = r / 64, p = r % 64;
  b[h * 64 + p] |= uint8_t((q & 15) << (4 * s));
  b[128 + h * 32 + p % 32] |= uint8_t((q >> 4) << (2 * (2 * s + p / 32)));
}
// the byte and shift of element k (< 32) of row s in a Q6_K group's high-bit plane (after its nibble vectors)
inline int k8_hi_byte(int s, int k) { return 128 + 32 * (k >> 4) + 4 * s + (k & 3); }
inline int k8_hi_shift(int k) { return 2 * ((k >> 2) & 3); }

void k8_put(int kq, const uint8_t* fb, int s, uint8_t* tb) {  // into a zeroed tile-block
  if (kq == 12) {
    std::memcpy(tb + 2 * s, fb, 2);
    std::memcpy(tb + 16 + 2 * s, fb + 2, 2);
    for (int j = 0; j < 8; ++j) {
      int sc, m;
      scale_min_k4(fb + 4, j, sc, m);
      tb[32 + 16 * j + 2 * s] = uint8_t(sc);
      tb[32 + 16 * j + 2 * s + 1] = uint8_t(m);
      uint8_t* q = tb + 160 + 128 * j;
      for (int k = 0; k < 32; ++k) {
        const int v = (fb[16 + 32 * (j >> 1) + k] >> (4 * (j & 1))) & 15;
        q[x8_byte(s, k)] |= uint8_t(k < 16 ? v : v << 4);
      }
    }
    return;
  }
  std::memcpy(tb + 2 * s, fb + 208, 2);
  for (int j = 0; j < 8; ++j) {
    tb[16 + 16 * j + 2 * s] = fb[192 + 2 * j];
    tb[16 + 16 * j + 2 * s + 1] = fb[192 + 2 * j + 1];
    uint8_t* q = tb + 144 + 192 * j;
    for (int k = 0; k < 32; ++k) {
      const int v = q6_get(fb, 32 * j + k);
      q[x8_byte(s, k)] |= uint8_t(k < 16 ? (v & 15) : (v & 15) << 4);
      q[k8_hi_byte(s, k)] |= uint8_t((v >> 4) << k8_hi_shift(k));
    }
  }
}

void k8_get(int kq, const uint8_t* tb, int s, uint8_t* fb) {  // into a zeroed file block
  if (kq == 12) {
    std::memcpy(fb, tb + 2 * s, 2);
    std::memcpy(fb + 2, tb + 16 + 2 * s, 2);
    uint8_t* p = fb + 4;  // the inverse of scale_min_k4: every one of the 96 bits is used, so the bytes are the file's
    for (int j = 0; j < 8; ++j) {
      const int sc = tb[32 + 16 * j + 2 * s], m = tb[32 + 16 * j + 2 * s + 1];
      if (j < 4) { p[j] |= uint8_t(sc); p[j + 4] |= uint8_t(m); }
      else {
        p[j + 4] = uint8_t((sc & 15) | ((m & 15) << 4));
        p[j - 4] |= uint8_t((sc >> 4) << 6);
        p[j] |= uint8_t((m >> 4) << 6);
      }
      const uint8_t* q = tb + 160 + 128 * j;
      for (int k = 0; k < 32; ++k) {
        const uint8_t nb = q[x8_byte(s, k)];
        fb[16 + 32 * (j >> 1) + k] |= uint8_t(((k < 16 ? nb : nb >> 4) & 15) << (4 * (j & 1)));
      }
    }
    return;
  }
  std::memcpy(fb + 208, tb + 2 * s, 2);
  for (int j = 0; j < 8; ++j) {
    fb[192 + 2 * j] = tb[16 + 16 * j + 2 * s];
    fb[192 + 2 * j + 1] = tb[16 + 16 * j + 2 * s + 1];
    const uint8_t* q = tb + 144 + 192 * j;
    for (int k = 0; k < 32; ++k) {
      const uint8_t nb = q[x8_byte(s, k)];
      const int lo = (k < 16 ? nb : nb >> 4) & 15, hi = (q[k8_hi_byte(s, k)] >> k8_hi_shift(k)) & 3;
      q6_set(fb, 32 * j + k, lo | (hi << 4));
    }
  }
}

// An interleaved form's layout at run time (what the X8 / XQ8_0 structs say at compile time); ok: the type is one
// (kq: the K-quant's GGML type, 0 for the others; gbytes: a tile's bytes per 32 elements)
struct X8Info { bool ok; int off; bool min; bool q5; bool q8; int head; int gbytes; int kq; };
template <class T>
constexpr X8Info x8_of() { return {true, T::off, T::min, T::q5, T::sign, T::head, T::gbytes, T::kq}; }
inline X8Info x8_info(int64_t t) {
  switch (t) {
    case 1002: return x8_of<XQ4_0>();
    case 1003: return x8_of<XQ4_1>();
    case 1006: return x8_of<XQ5_0>();
    case 1007: return x8_of<XQ5_1>();
    case 1008: return x8_of<XQ8_0>();
    case 1012: return x8_of<XQ4_K>();
    case 1014: return x8_of<XQ6_K>();
  }
  return {false, 0, false, false, false, 0, 0, 0};
}

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

inline void deq_row(const QType& q, const uint8_t* row, int64_t K, float* y);

// A weight matrix w [data rows, row bytes] of `type` (a GGML type or an interleaved form), rows of K elements: its
// layout, checked, and its number of matrix rows N
struct WLayout { X8Info xi; QType q; int64_t N; };
WLayout layout(const torch::Tensor& w, int64_t type, int64_t K) {
  const X8Info xi = x8_info(type);
  const QType q = xi.ok ? QType{32, 0, nullptr} : qtype(type);
  TORCH_CHECK(K % (xi.kq ? 256 : q.block) == 0 && w.size(1) == (xi.ok ? K / 32 * xi.gbytes : K / q.block * q.bytes),
              "w's row bytes disagree with K and the type");
  return {xi, q, w.size(0) * (xi.ok ? 8 : 1)};
}

// Matrix row n of w (data rows of RB bytes) unpacked to y[K]
inline void unpack_row(const WLayout& l, const uint8_t* w, int64_t RB, int64_t n, int64_t K, float* y) {
  if (l.xi.ok) x8_row(l.xi, w, RB, n, K, y);
  else deq_row(l.q, w + n * RB, K, y);
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

// ---------------------------------------------------------------------------------------------------------------
// Row-wise fp32 operations of the decode step, one call each instead of torch's chain of small ops (on a 2-core CPU
// a step of a small model spends more time dispatching those than multiplying).  Each row is computed alone, in a
// fixed order: batch-invariant like the products.

// y = (x * (1 / sqrt(mean(x^2) + eps))) * w over the last dimension d of x [R, d]
torch::Tensor rms_norm(torch::Tensor x, torch::Tensor w, double eps) {
  TORCH_CHECK(x.dtype() == torch::kFloat32 && w.dtype() == torch::kFloat32 && w.dim() == 1, "fp32 x and w");
  x = x.contiguous();
  const int64_t d = w.size(0);
  TORCH_CHECK(x.size(-1) == d, "x's last dimension differs from w's");
  const int64_t R = x.numel() / d;
  auto out = torch::empty_like(x);
  const float* xp = x.data_ptr<float>();
  const float* wp = w.contiguous().data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t d8 = d & ~int64_t(7);
  at::parallel_for(0, R, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = xp + r * d;
      float* yr = op + r * d;
      __m256 acc = _mm256_setzero_ps();
      for (int64_t k = 0; k < d8; k += 8) { const __m256 v = _mm256_loadu_ps(xr + k); acc = _mm256_add_ps(acc, _mm256_mul_ps(v, v)); }
      float ss = hsum8(acc);
      for (int64_t k = d8; k < d; ++k) ss += xr[k] * xr[k];
      const float inv = 1.0f / std::sqrt(ss / float(d) + float(eps));
      const __m256 iv = _mm256_set1_ps(inv);
      for (int64_t k = 0; k < d8; k += 8)
        _mm256_storeu_ps(yr + k, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(xr + k), iv), _mm256_loadu_ps(wp + k)));
      for (int64_t k = d8; k < d; ++k) yr[k] = (xr[k] * inv) * wp[k];
    }
  });
  return out;
}

// Rotary embedding of x [T, H, D] with cos, sin [T, D]: x * cos + rotate_half(x) * sin (two products, one sum, as
// torch computes them: the same values)
torch::Tensor rope(torch::Tensor x, torch::Tensor cos, torch::Tensor sin) {
  TORCH_CHECK(x.dtype() == torch::kFloat32 && cos.dtype() == torch::kFloat32 && sin.dtype() == torch::kFloat32 &&
              x.dim() == 3, "fp32 x [T, H, D], cos and sin [T, D]");
  x = x.contiguous(); cos = cos.contiguous(); sin = sin.contiguous();
  const int64_t T = x.size(0), H = x.size(1), D = x.size(2), half = D / 2;
  TORCH_CHECK(cos.size(0) == T && cos.size(1) == D && sin.size(0) == T && sin.size(1) == D && D % 2 == 0,
              "cos and sin: [T, D]");
  auto out = torch::empty_like(x);
  const float* xp = x.data_ptr<float>();
  const float* cp = cos.data_ptr<float>();
  const float* sp = sin.data_ptr<float>();
  float* op = out.data_ptr<float>();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      const float* xr = xp + (t * H + h) * D;
      float* yr = op + (t * H + h) * D;
      const float* c = cp + t * D;
      const float* s = sp + t * D;
      for (int64_t i = 0; i < half; ++i) yr[i] = xr[i] * c[i] + (-xr[i + half]) * s[i];
      for (int64_t i = half; i < D; ++i) yr[i] = xr[i] * c[i] + xr[i - half] * s[i];
    }
  return out;
}

// Attention of a few query rows over the cached keys.  A work item is one query row and up to HC heads of one key
// group (they share every key and value row it reads); it visits exactly the keys the row may see, in slot order:
// scores in fp32 (each the same 8-lane fma chain and horizontal sum, whichever heads and keys share a pass),
// e = exp(score - max) (a vectorized expf), a sequential fp32 sum of the e's, and per output element a sequential
// fma chain over the values.  A row's result depends only on its own visible keys, not on the other rows of the
// call nor on masked slots: the one-token decode step and a tree-verify pass agree bit for bit.
// q: [H, T, D]; k, v: [G, S, D] with unit stride along D, all bf16 (E = uint16_t) or all fp32 (E = float);
// allowed: [T, S] bool or empty (all visible).

// e^x, 8 lanes (x <= 0 here): Cephes' expf — x = n ln2 + r by a two-part ln 2, a degree-5 polynomial in r, times
// 2^n — within 2 ulp of std::exp over the range; the same value in every lane and call.
inline __m256 exp_ps(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.3365447f));  // below: e^x underflows to 0 (as std::exp's denormals)
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(0.693359375f)));
  r = _mm256_sub_ps(r, _mm256_mul_ps(n, _mm256_set1_ps(-2.12194440e-4f)));
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}
inline float exp1(float x) {  // exp_ps for one value (the tail of a row)
  alignas(32) float o[8];
  _mm256_store_ps(o, exp_ps(_mm256_set1_ps(x)));
  return o[0];
}

// scores[r * S + n] = (q_r . key(vis[n])) * sc for the NH heads' fp32 rows q_r (stride D) and the visible keys, KB
// keys at a time (NH * KB independent fma chains; each dot the same chain of 8-lane fmas, hsum8 and scalar tail).
template <typename E, int NH, int KB>
void scores_rows(const float* q, int64_t D, const E* kp, int64_t ks1, const int32_t* vis, int64_t nv, float sc,
                 int64_t S, float* scores) {
  const int64_t D8 = D & ~int64_t(7);
  int64_t n = 0;
  for (; n + KB <= nv; n += KB) {
    const E* kr[KB];
    for (int b = 0; b < KB; ++b) kr[b] = kp + vis[n + b] * ks1;
    __m256 acc[NH][KB];
    for (int r = 0; r < NH; ++r)
      for (int b = 0; b < KB; ++b) acc[r][b] = _mm256_setzero_ps();
    for (int64_t k = 0; k < D8; k += 8) {
      __m256 kv[KB];
      for (int b = 0; b < KB; ++b) kv[b] = load8(kr[b] + k);
      for (int r = 0; r < NH; ++r) {
        const __m256 qv = _mm256_loadu_ps(q + r * D + k);
        for (int b = 0; b < KB; ++b) acc[r][b] = _mm256_fmadd_ps(qv, kv[b], acc[r][b]);
      }
    }
    for (int r = 0; r < NH; ++r)
      for (int b = 0; b < KB; ++b) {
        float s = hsum8(acc[r][b]);
        for (int64_t k = D8; k < D; ++k) s += q[r * D + k] * to_f32(kr[b][k]);
        scores[r * S + n + b] = s * sc;
      }
  }
  for (; n < nv; ++n)  // the last keys, one at a time (the same chain per dot)
    scores_rows<E, NH, 1>(q, D, kp, ks1, vis + n, 1, sc, S, scores + n);
}

template <typename E, int NH>
void attend_heads(const float* qf, const E* kp, const E* vp, int64_t ks1, int64_t vs1, const int32_t* vis, int64_t nv,
                  int64_t D, int64_t S, float sc, float* scores, E* const* orow) {
  scores_rows<E, NH, (NH >= 4 ? 2 : 8 / NH)>(qf, D, kp, ks1, vis, nv, sc, S, scores);
  const int64_t D8 = D & ~int64_t(7);
  for (int r = 0; r < NH; ++r) {
    float* e = scores + r * S;
    float mx = -INFINITY;
    for (int64_t n = 0; n < nv; ++n) mx = std::max(mx, e[n]);
    float sum = 0.0f;
    if (nv > 0) {
      const __m256 m = _mm256_set1_ps(mx);
      int64_t n = 0;
      for (; n + 8 <= nv; n += 8) _mm256_storeu_ps(e + n, exp_ps(_mm256_sub_ps(_mm256_loadu_ps(e + n), m)));
      for (; n < nv; ++n) e[n] = exp1(e[n] - mx);
      for (n = 0; n < nv; ++n) sum += e[n];
    }
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    // out[d] = (sum_n e_n v_n[d]) * inv: 64 elements of d at a time in registers, a sequential fma chain over n
    for (int64_t d0 = 0; d0 < D8; d0 += 64) {
      const int nd = int(std::min<int64_t>(64, D8 - d0) / 8);
      __m256 acc[8];
      for (int u = 0; u < 8; ++u) acc[u] = _mm256_setzero_ps();
      for (int64_t n = 0; n < nv; ++n) {
        const __m256 ev = _mm256_set1_ps(e[n]);
        const E* vr = vp + vis[n] * vs1 + d0;
        if (nd == 8) {
          for (int u = 0; u < 8; ++u) acc[u] = _mm256_fmadd_ps(ev, load8(vr + 8 * u), acc[u]);
        } else {
          for (int u = 0; u < nd; ++u) acc[u] = _mm256_fmadd_ps(ev, load8(vr + 8 * u), acc[u]);
        }
      }
      alignas(32) float o[64];
      for (int u = 0; u < nd; ++u) _mm256_store_ps(o + 8 * u, acc[u]);
      for (int i = 0; i < 8 * nd; ++i) store_f32(orow[r] + d0 + i, o[i] * inv);
    }
    for (int64_t d = D8; d < D; ++d) {
      float a = 0.0f;
      for (int64_t n = 0; n < nv; ++n) a += e[n] * to_f32(vp[vis[n] * vs1 + d]);
      store_f32(orow[r] + d, a * inv);
    }
  }
}

constexpr int HC = 2;  // heads per work item (decode: Gemma's 4 heads of one group make 2 items for 2 cores)

template <typename E>
void attend_impl(const E* qp, const E* kp, const E* vp, const bool* mp, E* op, int64_t H, int64_t T, int64_t D,
                 int64_t S, int64_t ks0, int64_t ks1, int64_t vs0, int64_t vs1, int64_t rep, float sc) {
  const int64_t G = H / rep, nc = (rep + HC - 1) / HC;
  at::parallel_for(0, G * nc * T, 1, [&](int64_t b0, int64_t b1) {
    std::vector<float> qf(HC * D), scores(HC * std::max<int64_t>(S, 1));
    std::vector<int32_t> vis(std::max<int64_t>(S, 1));
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t t = b % T, c = (b / T) % nc, g = b / (T * nc);
      const int64_t h0 = g * rep + c * HC, nh = std::min<int64_t>(HC, rep - c * HC);
      const bool* mrow = mp ? mp + t * S : nullptr;
      int64_t nv = 0;
      for (int64_t j = 0; j < S; ++j)
        if (!mrow || mrow[j]) vis[nv++] = int32_t(j);
      E* orow[HC];
      for (int64_t r = 0; r < nh; ++r) {
        const E* qrow = qp + ((h0 + r) * T + t) * D;
        for (int64_t d = 0; d < D; ++d) qf[r * D + d] = to_f32(qrow[d]);
        orow[r] = op + ((h0 + r) * T + t) * D;
      }
      const E* kg = kp + g * ks0;
      const E* vg = vp + g * vs0;
      if (nh == 2) attend_heads<E, 2>(qf.data(), kg, vg, ks1, vs1, vis.data(), nv, D, S, sc, scores.data(), orow);
      else attend_heads<E, 1>(qf.data(), kg, vg, ks1, vs1, vis.data(), nv, D, S, sc, scores.data(), orow);
    }
  });
}

torch::Tensor attend_rows(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor allowed, double scale) {
  const auto dt = q.scalar_type();
  TORCH_CHECK((dt == torch::kBFloat16 || dt == torch::kFloat32) && k.scalar_type() == dt && v.scalar_type() == dt,
              "q, k, v: all bf16 or all fp32");
  q = q.contiguous();
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3, "q [H, T, D], k and v [G, S, D]");
  const int64_t H = q.size(0), T = q.size(1), D = q.size(2), G = k.size(0), S = k.size(1);
  TORCH_CHECK(k.size(2) == D && v.size(2) == D && v.size(0) == G && v.size(1) == S && G > 0 && H % G == 0,
              "q, k, v shapes disagree");
  TORCH_CHECK(k.stride(2) == 1 && v.stride(2) == 1, "k, v: unit stride along D");
  const bool has_mask = allowed.defined() && allowed.numel() > 0;
  if (has_mask)
    TORCH_CHECK(allowed.dtype() == torch::kBool && allowed.is_contiguous() && allowed.dim() == 2 &&
                allowed.size(0) == T && allowed.size(1) == S, "allowed: contiguous bool [T, S]");
  auto out = torch::empty({H, T, D}, q.options());
  const bool* mp = has_mask ? allowed.data_ptr<bool>() : nullptr;
  const float sc = static_cast<float>(scale);
  if (dt == torch::kBFloat16) {
    auto ptr = [](torch::Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr<at::BFloat16>()); };
    attend_impl<uint16_t>(ptr(q), ptr(k), ptr(v), mp, ptr(out), H, T, D, S, k.stride(0), k.stride(1), v.stride(0),
                          v.stride(1), H / G, sc);
  } else {
    attend_impl<float>(q.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(), mp, out.data_ptr<float>(), H,
                       T, D, S, k.stride(0), k.stride(1), v.stride(0), v.stride(1), H / G, sc);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------------------------
// One decoder layer of a packed GGUF model on fp32 rows: the operations of NativeCausalLM.layer, in its order,
// through the same kernels and torch operations — the same values, without a Python dispatch per operation (on a
// 2-core CPU that dispatch cost a small model's decode step as much as its products).
torch::Tensor linear_q8(torch::Tensor x, torch::Tensor w, int64_t type, int64_t K);

torch::Tensor lin(const torch::Tensor& x, const torch::Tensor& w, int64_t type, int64_t K, int64_t integer,
                  const torch::Tensor& bias) {
  torch::Tensor y = integer ? linear_q8(x, w, type, K) : linear_q(x, w, type, K);
  return bias.defined() && bias.numel() ? y + bias : y;
}

// mats: q, k, v, o, gate, up, down (packed data); meta: type, K, integer for each; biases: the same 7 (empty: none);
// norms: input, post_attention, pre_feedforward, post_feedforward, q, k (effective fp32 weights; empty: absent);
// kv: this layer's [2, G, capacity, hd] cache; keys lo..start+T-1 visible through `allowed` [T, S'] (empty: all);
// dims: heads, kv heads, head dim, activation (0 silu, 1 gelu tanh, 2 gelu), gemma sandwich norms (0/1).
torch::Tensor layer_step(torch::Tensor x, std::vector<torch::Tensor> mats, std::vector<int64_t> meta,
                         std::vector<torch::Tensor> biases, std::vector<torch::Tensor> norms, torch::Tensor cos,
                         torch::Tensor sin, torch::Tensor kv, int64_t start, int64_t lo, torch::Tensor allowed,
                         std::vector<int64_t> dims, double eps, double scale) {
  TORCH_CHECK(mats.size() == 7 && meta.size() == 21 && biases.size() == 7 && norms.size() == 6 && dims.size() == 5,
              "layer_step: 7 matrices, 21 meta values, 7 biases, 6 norms, 5 dims");
  const int64_t T = x.size(0), nh = dims[0], nkv = dims[1], hd = dims[2], act = dims[3];
  const bool gemma = dims[4] != 0;
  auto L = [&](int i, const torch::Tensor& in) { return lin(in, mats[i], meta[3 * i], meta[3 * i + 1], meta[3 * i + 2], biases[i]); };
  auto N = [&](int i, const torch::Tensor& in) { return rms_norm(in, norms[i], eps); };
  const torch::Tensor h = norms[0].numel() ? N(0, x) : x;
  torch::Tensor q = L(0, h).view({T, nh, hd});
  torch::Tensor k = L(1, h).view({T, nkv, hd});
  const torch::Tensor v = L(2, h).view({T, nkv, hd}).transpose(0, 1);
  if (norms[4].numel()) { q = N(4, q); k = N(5, k); }
  q = rope(q, cos, sin).transpose(0, 1);
  k = rope(k, cos, sin).transpose(0, 1);
  kv.select(0, 0).narrow(1, start, T).copy_(k);
  kv.select(0, 1).narrow(1, start, T).copy_(v);
  const int64_t S = start + T;
  const torch::Tensor keys = kv.select(0, 0).narrow(1, lo, S - lo), values = kv.select(0, 1).narrow(1, lo, S - lo);
  torch::Tensor o = attend_rows(q, keys, values, allowed, scale);
  o = L(3, o.transpose(0, 1).reshape({T, nh * hd}));
  auto mlp = [&](const torch::Tensor& in) {
    torch::Tensor g = L(4, in);
    g = act == 0 ? at::silu(g) : act == 1 ? at::gelu(g, "tanh") : at::gelu(g);
    return L(6, g * L(5, in));
  };
  if (gemma) {
    x = x + N(1, o);
    return x + N(3, mlp(N(2, x)));
  }
  x = x + o;
  return x + mlp(N(1, x));
}

// Index of the largest value of the fp32 vector x (the first one among equals; the first NaN if there is one: what
// torch.argmax returns), in one vectorized pass for the maximum and one for its first index.
int64_t argmax_f32(torch::Tensor x) {
  TORCH_CHECK(x.dtype() == torch::kFloat32 && x.dim() == 1 && x.is_contiguous() && x.numel() > 0,
              "x: contiguous non-empty fp32 vector");
  const float* p = x.data_ptr<float>();
  const int64_t n = x.numel(), n8 = n & ~int64_t(7);
  __m256 mx = _mm256_set1_ps(-INFINITY), nan = _mm256_setzero_ps();
  for (int64_t i = 0; i < n8; i += 8) {
    const __m256 v = _mm256_loadu_ps(p + i);
    mx = _mm256_max_ps(mx, v);
    nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, mx);
  float m = lanes[0];
  for (int j = 1; j < 8; ++j) m = std::max(m, lanes[j]);
  bool has_nan = _mm256_movemask_ps(nan) != 0;
  for (int64_t i = n8; i < n; ++i) { if (std::isnan(p[i])) has_nan = true; else m = std::max(m, p[i]); }
  if (has_nan) {
    for (int64_t i = 0; i < n; ++i) if (std::isnan(p[i])) return i;
  }
  const __m256 mv = _mm256_set1_ps(m);
  for (int64_t i = 0; i < n8; i += 8) {
    const int mask = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(p + i), mv, _CMP_EQ_OQ));
    if (mask) return i + __builtin_ctz(mask);
  }
  for (int64_t i = n8; i < n; ++i) if (p[i] == m) return i;
  return 0;  // unreachable: m is one of the values
}

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
    const __m256 sv = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b)));
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
  for (int i = 0; i < MT; ++i) _mm256_storeu_ps(out + 8 * i, T::min ? _mm256_add_ps(acc[i], accm[i]) : acc[i]);
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
  }
  for (int i = 0; i < MT; ++i) _mm256_storeu_ps(out + 8 * i, T::min ? _mm256_add_ps(acc[i], accm[i]) : acc[i]);
}

template <class T, int MT>
inline void tile_any(const Act& a, const int32_t* offs, const uint8_t* w, int64_t m0, float* out) {
  if constexpr (T::kq != 0) tile_k8<T, MT>(a, offs, w, m0, out);
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
              case 4: tile_any<T, 4>(a, offs.data(), wt, m0, buf); break;
              case 3: tile_any<T, 3>(a, offs.data(), wt, m0, buf); break;
              case 2: tile_any<T, 2>(a, offs.data(), wt, m0, buf); break;
              default: tile_any<T, 1>(a, offs.data(), wt, m0, buf); break;
            }
            for (int64_t i = 0; i < mt; ++i) std::memcpy(op + (m0 + i) * N + 8 * t, buf + 8 * i, 8 * sizeof(float));
          }
      }
    }
  });
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

// Rows `ids` of an interleaved form w (type) back in the file's block format [n, row bytes] (a static shortlist's
// or a draft head's rows: the same bytes as the file's rows)
torch::Tensor x8_gather(torch::Tensor w, int64_t type, int64_t K, torch::Tensor ids) {
  const X8Info xi = x8_info(type);
  TORCH_CHECK(xi.ok, "x8_gather: not an interleaved form");
  TORCH_CHECK(w.dtype() == torch::kUInt8 && w.dim() == 2 && w.stride(1) == 1 && w.size(1) == K / 32 * xi.gbytes,
              "w: uint8 [N / 8, tile bytes]");
  TORCH_CHECK(ids.dtype() == torch::kLong && ids.dim() == 1, "ids: int64 [n]");
  TORCH_CHECK(K % (xi.kq ? 256 : 32) == 0, "x8_gather: K is not a whole number of blocks");
  ids = ids.contiguous();
  const QType q = qtype(type - 1000);
  const int64_t n = ids.size(0), N = w.size(0) * 8, RB = w.stride(0), G = K / 32;
  const int64_t* ip = ids.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) TORCH_CHECK(ip[i] >= 0 && ip[i] < N, "row id ", ip[i], " out of range");
  const int64_t row_bytes = K / q.block * q.bytes;
  auto out = torch::zeros({n, row_bytes}, w.options().memory_format(at::MemoryFormat::Contiguous));
  const uint8_t* wp = w.data_ptr<uint8_t>();
  uint8_t* op = out.data_ptr<uint8_t>();
  const int lead = xi.min ? 4 : 2;
  at::parallel_for(0, n, 64, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t = ip[i] / 8;
      const int s = int(ip[i] % 8);
      if (xi.kq) {  // out is zeroed
        for (int64_t b = 0; b < K / 256; ++b)
          k8_get(xi.kq, wp + t * RB + b * 8 * xi.gbytes, s, op + i * row_bytes + b * q.bytes);
        continue;
      }
      for (int64_t g = 0; g < G; ++g) {
        const uint8_t* b = wp + t * RB + g * xi.gbytes;
        uint8_t* o = op + i * row_bytes + g * q.bytes;
        std::memcpy(o, b + 2 * s, 2);
        if (xi.q8) {
          for (int k = 0; k < 32; ++k) o[2 + k] = b[xi.head + x8_chunk_byte(s, k)];
          continue;
        }
        if (xi.min) std::memcpy(o + 2, b + 16 + 2 * s, 2);
        uint32_t qh = 0;
        uint8_t* qs = o + lead + (xi.q5 ? 4 : 0);
        for (int k = 0; k < 32; ++k) {
          const uint8_t nb = b[xi.head + x8_byte(s, k)];
          if (k < 16) qs[k] = nb & 15; else qs[k - 16] |= uint8_t(nb & 0xF0);
          if (xi.q5) qh |= uint32_t((b[xi.head + x8_bit_byte(s, k)] >> (k >> 2)) & 1) << k;
        }
        if (xi.q5) std::memcpy(o + lead, &qh, 4);
      }
    }
  });
  return out;
}

// Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 rows w [N, row bytes] (N a multiple of 8) -> their interleaved form (type + 1000, see X8):
// [N / 8, 8 x row bytes], the same scales, mins and quant bits.
torch::Tensor repack_x8(torch::Tensor w, int64_t type) {
  TORCH_CHECK(w.dtype() == torch::kUInt8 && w.dim() == 2 && w.stride(1) == 1, "w: uint8 [N, row bytes]");
  TORCH_CHECK(type == 2 || type == 3 || type == 6 || type == 7 || type == 8 || type == 12 || type == 14,
              "repack_x8: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K or Q6_K only");
  const QType q = qtype(type);
  const X8Info xi = x8_info(type + 1000);
  TORCH_CHECK(w.size(1) % q.bytes == 0, "w's row bytes are not whole blocks");
  TORCH_CHECK(w.size(0) % 8 == 0, "repack_x8: the number of rows must be a multiple of 8");
  const int64_t N = w.size(0), RB = w.stride(0), G = w.size(1) / q.bytes * (q.block / 32);  // 32-element groups
  const int lead = xi.min ? 4 : 2;  // scale (+ min) bytes of a packed block
  auto out = torch::zeros({N / 8, G * xi.gbytes}, w.options().memory_format(at::MemoryFormat::Contiguous));
  const uint8_t* wp = w.data_ptr<uint8_t>();
  uint8_t* op = out.data_ptr<uint8_t>();
  at::parallel_for(0, N / 8, 16, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      if (xi.kq) {
        for (int64_t b = 0; b < G / 8; ++b)
          for (int s = 0; s < 8; ++s)
            k8_put(xi.kq, wp + (8 * t + s) * RB + b * q.bytes, s, op + t * G * xi.gbytes + b * 8 * xi.gbytes);
        continue;
      }
      for (int64_t g = 0; g < G; ++g) {
        uint8_t* o = op + t * G * xi.gbytes + g * xi.gbytes;
        for (int s = 0; s < 8; ++s) {
          const uint8_t* b = wp + (8 * t + s) * RB + g * q.bytes;
          std::memcpy(o + 2 * s, b, 2);
          if (xi.q8) {
            for (int k = 0; k < 32; ++k) o[xi.head + x8_chunk_byte(s, k)] = b[2 + k];
            continue;
          }
          if (xi.min) std::memcpy(o + 16 + 2 * s, b + 2, 2);
          uint32_t qh = 0;
          if (xi.q5) std::memcpy(&qh, b + lead, 4);
          const uint8_t* qs = b + lead + (xi.q5 ? 4 : 0);
          for (int k = 0; k < 32; ++k) {
            const int nib = k < 16 ? (qs[k] & 15) : (qs[k - 16] >> 4);
            o[xi.head + x8_byte(s, k)] |= uint8_t(k < 16 ? nib : nib << 4);
            if (xi.q5) o[xi.head + x8_bit_byte(s, k)] |= uint8_t(((qh >> k) & 1) << (k >> 2));
          }
        }
      }
    }
  });
  return out;
}
"""

_CPP_DECL = ("torch::Tensor linear_q(torch::Tensor x, torch::Tensor w, int64_t type, int64_t K);\n"
             "torch::Tensor dequant_rows(torch::Tensor w, int64_t type, int64_t K, torch::Tensor ids);\n"
             "int64_t argmax_f32(torch::Tensor x);\n"
             "torch::Tensor linear_q8(torch::Tensor x, torch::Tensor w, int64_t type, int64_t K);\n"
             "torch::Tensor repack_x8(torch::Tensor w, int64_t type);\n"
             "torch::Tensor x8_gather(torch::Tensor w, int64_t type, int64_t K, torch::Tensor ids);\n"
             "torch::Tensor rms_norm(torch::Tensor x, torch::Tensor w, double eps);\n"
             "torch::Tensor rope(torch::Tensor x, torch::Tensor cos, torch::Tensor sin);\n"
             "torch::Tensor attend_rows(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor allowed, "
             "double scale);\n"
             "torch::Tensor layer_step(torch::Tensor x, std::vector<torch::Tensor> mats, std::vector<int64_t> meta, "
             "std::vector<torch::Tensor> biases, std::vector<torch::Tensor> norms, torch::Tensor cos, "
             "torch::Tensor sin, torch::Tensor kv, int64_t start, int64_t lo, torch::Tensor allowed, "
             "std::vector<int64_t> dims, double eps, double scale);")

_EXT = Extension("cpu_quant", _SOURCE, _CPP_DECL, ["linear_q", "dequant_rows", "argmax_f32", "linear_q8", "repack_x8", "x8_gather", "rms_norm", "rope", "attend_rows",
                  "layer_step"], "CPU quantized-weight kernel",
                 flags=("-mf16c", "-ffp-contract=off"))


def available() -> bool:
    """Whether products with packed GGUF weights can run here (built on first call)."""
    return _EXT.available()


def build_error() -> str | None:
    return _EXT.failed


def linear(x: torch.Tensor, data: torch.Tensor, type_id: int, cols: int) -> torch.Tensor:
    """``x`` [..., K] (any float dtype) times the packed rows ``data`` [N, row bytes] of GGML type ``type_id``,
    transposed: fp32 [..., N]."""
    lead = x.shape[:-1]
    x2 = x.reshape(-1, cols).to(torch.float32).contiguous()
    y = _EXT.module.linear_q(x2, data, type_id, cols)
    return y.reshape(*lead, y.shape[-1])


def linear_q8(x: torch.Tensor, data: torch.Tensor, type_id: int, cols: int) -> torch.Tensor:
    """:func:`linear` on the integer path: ``x`` quantized per row and 32-element block to int8 (see
    :func:`quantize_activations`), exact int32 block sums; fp32 [..., N]."""
    if x.dim() == 2 and x.dtype == torch.float32 and x.is_contiguous():  # the decode step's shape: no reshapes
        return _EXT.module.linear_q8(x, data, type_id, cols)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, cols).to(torch.float32).contiguous()
    y = _EXT.module.linear_q8(x2, data, type_id, cols)
    return y.reshape(*lead, y.shape[-1])


def repack(data: torch.Tensor, qtype: str) -> torch.Tensor:
    """The rows ``data`` [N, row bytes] (N a multiple of 8) of a Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 / Q4_K / Q6_K
    matrix in their interleaved form ``INTERLEAVED[qtype]`` ([N / 8, 8 x row bytes]: 8 rows' groups together, the
    same bits; Q4_K's sub-block scales unpacked to a byte each, 148 bytes a block instead of 144; see the C++
    comments).  The same weight values; the integer product multiplies 8 rows at once."""
    return _EXT.module.repack_x8(data, TYPES[qtype][0])


def gather_interleaved(data: torch.Tensor, type_id: int, cols: int, ids: torch.Tensor) -> torch.Tensor:
    """Rows ``ids`` of an interleaved form, back in the file's block format [len(ids), row bytes]."""
    return _EXT.module.x8_gather(data, type_id, cols, ids.reshape(-1).to(torch.long).cpu())


def quantize_activations(x: torch.Tensor) -> torch.Tensor:
    """What the integer path multiplies in place of ``x`` [..., K]: each 32-element block rounded to int8 steps of
    max|x| / 127 (fp32, round half to even), returned dequantized in fp32 (the tests' reference)."""
    xb = x.float().reshape(*x.shape[:-1], -1, 32)
    d = xb.abs().amax(-1, keepdim=True) / 127.0
    inv = torch.where(d != 0, 1.0 / d, torch.zeros_like(d))
    return (torch.round(xb * inv) * d).reshape(x.shape)


def rows_apply(x: torch.Tensor) -> bool:
    """Whether the fused row-wise operations (:func:`rms_norm`, :func:`rope`) serve ``x``: fp32 on a CPU, no
    gradient wanted, kernel available."""
    return (x.dtype == torch.float32 and x.device.type == "cpu" and not (torch.is_grad_enabled() and x.requires_grad)
            and available())


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x * rsqrt(mean(x^2) + eps) * weight`` over the last dimension, fp32, one row at a time."""
    return _EXT.module.rms_norm(x, weight, eps)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x * cos + rotate_half(x) * sin`` for ``x`` [T, H, D] and ``cos``, ``sin`` [T, D] (fp32)."""
    return _EXT.module.rope(x, cos, sin)


def attend_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor, scale: float):
    """Row-wise attention (see :func:`microspec.kernels.cpu_linear.attend`), bf16 or fp32."""
    return _EXT.module.attend_rows(q, k, v, allowed, scale)


def layer_step(x, mats, meta, biases, norms, cos, sin, kv, start, lo, allowed, dims, eps, scale):
    """One decoder layer of a packed model on fp32 rows ``x`` [T, d], writing its keys and values into ``kv``
    [2, kv heads, capacity, hd] at ``start`` (see the C++ comment for the arguments)."""
    return _EXT.module.layer_step(x, mats, meta, biases, norms, cos, sin, kv, start, lo, allowed, dims, eps, scale)


def argmax(x: torch.Tensor) -> int:
    """``int(x.argmax())`` for a vector ``x``: the first index of the largest value, the first NaN's if any (as
    torch); a vectorized pass on a CPU fp32 vector (torch's took ~0.4 ms for Gemma's 262,144 logits, ~3% of a
    packed decode step), torch's operation otherwise."""
    if x.dim() == 1 and x.dtype == torch.float32 and x.device.type == "cpu" and x.is_contiguous() and x.numel() \
            and available():
        return int(_EXT.module.argmax_f32(x))
    return int(x.argmax())


def dequant_rows(data: torch.Tensor, type_id: int, cols: int, ids: torch.Tensor) -> torch.Tensor:
    """Rows ``ids`` of the packed ``data``, unpacked to fp32 [len(ids), K]."""
    return _EXT.module.dequant_rows(data, type_id, cols, ids.reshape(-1).to(torch.long).cpu())
