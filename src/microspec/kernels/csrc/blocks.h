// GGUF block formats and their interleaved forms (repack_x8): the layouts that dequant.cpp, repack.cpp and
// quant_linear.cpp share.  Inline helpers and the compile-time layouts have internal linkage (an anonymous
// namespace); the types and functions used across files are in namespace microspec (defined in dequant.cpp).
#pragma once

#include "common.h"

namespace microspec {

struct QType { int block; int bytes; void (*deq)(const uint8_t*, float*); };

// An interleaved form's layout at run time (what the X8 / XQ8_0 structs say at compile time); ok: the type is one
// (kq: the K-quant's GGML type, 0 for the others; gbytes: a tile's bytes per 32 elements)
struct X8Info { bool ok; int off; bool min; bool q5; bool q8; int head; int gbytes; int kq; };

// A weight matrix w [data rows, row bytes] of `type` (a GGML type or an interleaved form), rows of K elements: its
// layout, checked, and its number of matrix rows N
struct WLayout { X8Info xi; QType q; int64_t N; };

QType qtype(int64_t t);  // a GGML type's block size, bytes and unpacking (refused with a TORCH_CHECK if not served)
WLayout layout(const torch::Tensor& w, int64_t type, int64_t K);
// Matrix row n of w (data rows of RB bytes) unpacked to y[K]
void unpack_row(const WLayout& l, const uint8_t* w, int64_t RB, int64_t n, int64_t K, float* y);

}  // namespace microspec

using microspec::QType;
using microspec::WLayout;
using microspec::X8Info;
using microspec::layout;
using microspec::qtype;
using microspec::unpack_row;

namespace {

inline float h2f(const uint8_t* p) { uint16_t h; std::memcpy(&h, p, 2); return _cvtsh_ss(h); }

// Q4_K / Q5_K: 8 sub-blocks of 32 with 6-bit scales and mins packed in 12 bytes
inline void scale_min_k4(const uint8_t* s, int j, int& sc, int& m) {
  if (j < 4) { sc = s[j] & 63; m = s[j + 4] & 63; }
  else { sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4); m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4); }
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
  // chunk c of group b (b: the group's first byte).  The fifth bit goes to bit 4 without a shift per chunk: bits
  // 4..7 of a plane byte are chunks 4..7's, bits 4..7 of the plane shifted left by 4 (one 16-bit shift, which the
  // compiler shares between chunks 0..3) chunks 0..3's, and min(bit, 16) is 16 where the bit is set, 0 where not.
  // Shifts have one port on some cores (AMD Zen 1: Q5_0's products bound by them).
  static inline __m256i chunk(const uint8_t* b, int c) {
    __m256i q = nib_chunk(b + head, c);
    if (Q5) {
      const __m256i p = load256(b + head + 128);
      const __m256i hb = _mm256_and_si256(c < 4 ? _mm256_slli_epi16(p, 4) : p, _mm256_set1_epi8(char(1 << (c | 4))));
      q = _mm256_or_si256(q, _mm256_min_epu8(hb, _mm256_set1_epi8(16)));
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
  // chunk c's 2 high bits (bits 2b, 2b + 1 of its plane byte, b = c % 4) moved to bits 4, 5: for b = 0, 1 a table
  // lookup (pshufb) on the byte's low nibble, which the compiler shares between the two, b = 2 in place, b = 3 one
  // shift; one 16-bit shift a plane instead of three (shifts have one port on some cores: AMD Zen 1)
  static inline __m256i chunk(const uint8_t* q, int c) {
    const __m256i h = load256(q + 128 + 32 * (c >> 2)), m = _mm256_set1_epi8(0x30);
    const int b = c & 3;
    __m256i hb;
    if (b < 2) {
      const __m256i lut = b == 0 ? _mm256_setr_epi8(0, 16, 32, 48, 0, 16, 32, 48, 0, 16, 32, 48, 0, 16, 32, 48,
                                                    0, 16, 32, 48, 0, 16, 32, 48, 0, 16, 32, 48, 0, 16, 32, 48)
                                 : _mm256_setr_epi8(0, 0, 0, 0, 16, 16, 16, 16, 32, 32, 32, 32, 48, 48, 48, 48,
                                                    0, 0, 0, 0, 16, 16, 16, 16, 32, 32, 32, 32, 48, 48, 48, 48);
      hb = _mm256_shuffle_epi8(lut, _mm256_and_si256(h, _mm256_set1_epi8(15)));
    } else {
      hb = _mm256_and_si256(b == 2 ? h : _mm256_srli_epi16(h, 2), m);
    }
    return _mm256_or_si256(nib_chunk(q, c), hb);
  }
};

// the byte and shift of element k (< 32) of row s in a Q6_K group's high-bit plane (after its nibble vectors)
inline int k8_hi_byte(int s, int k) { return 128 + 32 * (k >> 4) + 4 * s + (k & 3); }
inline int k8_hi_shift(int k) { return 2 * ((k >> 2) & 3); }

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

}  // namespace
