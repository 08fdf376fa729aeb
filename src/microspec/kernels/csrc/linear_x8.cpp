// The integer products with the interleaved forms of blocks.h (repack_x8): activation rows quantized to int8 (see
// quant_row in quant_linear.cpp) against tiles of 8 weight rows whose groups are unpacked in registers, exact int32
// group sums, then one fp32 chain per (row, weight row) lane.  Three instruction paths give the same exact int32
// sums and the same fp32 chain, so the same results bit for bit (tests/test_gguf.py); a call's plan names its path
// (the widest the CPU reports, by default; a path the CPU lacks falls back to AVX2):
//   0  AVX2: maddubs into int16 pair sums, then madd (tile_x8, tile_k8);
//   1  AVX-512 VNNI on 256-bit registers: one vpdpbusd per chunk and row (tile_x8_vnni, tile_k8_vnni);
//   2  AVX-512 VNNI on 512-bit registers: two tiles (16 weight rows) per register and up to 8 activation rows per
//      register tile, so each unpacked weight vector serves twice the rows (tile_x16, tile_k16);
//   3  AMX (Intel Xeon 4th generation on): a pair of tiles' weights are one AMX tile and up to 16 activation rows
//      another, one tdpbssd / tdpbsud a group (AmxRot, AmxQ6), where the tiles pay (amx_rows: Q8_0 at 9 or more
//      rows, and at 1-4 for a matrix of 16 MiB or more: the LM head of the built-in models); every other product
//      takes path 2.
#include "amx.h"
#include "blocks.h"
#include "int8.h"
#include "quant.h"


namespace {

// Software prefetch of the `bytes` at p (a group of a tile some tiles ahead, while this one is multiplied): the
// hardware prefetchers pick up each matrix chunk's stream late, and two tiles read side by side (path 2) defeat
// them (the measurements: docs/history.md, "A layer's products in fewer regions, and the prefetch chosen by
// measuring").
// HINT: the level it fills (_MM_HINT_T0 L1; AmxRot takes _MM_HINT_T1, L2), in the type of the compiler's hints
// (GCC's enum, clang's int).
template <int HINT = _MM_HINT_T0>
inline void prefetch_group(const uint8_t* p, int bytes) {
  for (int o = 0; o < bytes; o += 64)
    _mm_prefetch(reinterpret_cast<const char*>(p + o), static_cast<decltype(_MM_HINT_T0)>(HINT));
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
inline void tile_x8(const Act& a, const int32_t* offs, const uint8_t* w, int64_t m0, float* out, int64_t pf) {
  __m256 acc[MT], accm[MT];
  for (int i = 0; i < MT; ++i) { acc[i] = _mm256_setzero_ps(); accm[i] = _mm256_setzero_ps(); }
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t g = 0; g < a.G; ++g) {
    const uint8_t* b = w + g * T::gbytes;
    if (pf) prefetch_group(b + pf, T::gbytes);
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
                                 int64_t m0, float* out, int64_t pf) {
  __m256 acc[MT], accm[MT];
  for (int i = 0; i < MT; ++i) { acc[i] = _mm256_setzero_ps(); accm[i] = _mm256_setzero_ps(); }
  for (int64_t g = 0; g < a.G; ++g) {
    const uint8_t* b = w + g * T::gbytes;
    if (pf) prefetch_group(b + pf, T::gbytes);
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

// A K-quant tile-block B's fp16 d (which 0) or, for Q4_K, dmin (which 1) of its 8 rows, as fp32 lanes (Q6_K has
// no dmin: zeros)
template <class T>
inline __m256 k8_d(const uint8_t* B, int which) {
  if (which && !T::min) return _mm256_setzero_ps();
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(B + 16 * which)));
}

// Group j's sub-block scales of the 8 rows: lane s the int16 pair (byte 2s, byte 2s + 1), Q4_K's (sc, m) unsigned,
// Q6_K's (sc_a, sc_b) signed
template <class T>
inline __m256i k8_scales(const uint8_t* B, int j) {
  const __m128i sb = _mm_loadu_si128(reinterpret_cast<const __m128i*>(B + T::soff + 16 * j));
  return T::kq == 14 ? _mm256_cvtepi8_epi16(sb) : _mm256_cvtepu8_epi16(sb);
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
inline void tile_k8(const Act& a, const int32_t* offs, const uint8_t* w, int64_t m0, float* out, int64_t pf) {
  constexpr bool Q6 = T::kq == 14;
  __m256 acc[MT], accm[MT];
  for (int i = 0; i < MT; ++i) { acc[i] = _mm256_setzero_ps(); accm[i] = _mm256_setzero_ps(); }
  const __m256i hi16 = _mm256_set1_epi32(int32_t(0xFFFF0000u));
  for (int64_t blk = 0; blk < a.G / 8; ++blk) {
    const uint8_t* B = w + blk * T::tbytes;
    const __m256 dv = k8_d<T>(B, 0), dminv = k8_d<T>(B, 1);
    for (int j = 0; j < 8; ++j) {
      const int64_t g = blk * 8 + j;
      if (pf) prefetch_group(B + pf + j * T::tbytes / 8, T::tbytes / 8);  // an eighth of the tile-block ahead
      const __m256i sx = k8_scales<T>(B, j);
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
MICROSPEC_VNNI void tile_k8_vnni(const Act& a, const int32_t* offs, const uint8_t* w, int64_t m0, float* out,
                                 int64_t pf) {
  constexpr bool Q6 = T::kq == 14;
  __m256 acc[MT], accm[MT];
  for (int i = 0; i < MT; ++i) { acc[i] = _mm256_setzero_ps(); accm[i] = _mm256_setzero_ps(); }
  for (int64_t blk = 0; blk < a.G / 8; ++blk) {
    const uint8_t* B = w + blk * T::tbytes;
    const __m256 dv = k8_d<T>(B, 0), dminv = k8_d<T>(B, 1);
    for (int j = 0; j < 8; ++j) {
      const int64_t g = blk * 8 + j;
      if (pf) prefetch_group(B + pf + j * T::tbytes / 8, T::tbytes / 8);  // an eighth of the tile-block ahead
      const __m256i sx = k8_scales<T>(B, j);
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


// ---------------------------------------------------------------------------------------------------------------
// Path 2: two adjacent tiles (weight rows 8t..8t+15) in the two halves of a 512-bit register.  Lane l < 8 is tile t's
// row l, lane 8 + l tile t + 1's: each lane runs the same integer and fp32 operations, in the same order, as the
// 256-bit VNNI tiles, so its result is theirs bit for bit whatever the pairing or the rows beside it.
#define MICROSPEC_V512 __attribute__((target("avx512f,avx512vl,avx512bw,avx512vnni,avx512dq")))

MICROSPEC_V512 inline __m512i load2(const uint8_t* p0, const uint8_t* p1) {  // 32 bytes of each tile
  return _mm512_inserti64x4(_mm512_castsi256_si512(load256(p0)), load256(p1), 1);
}
MICROSPEC_V512 inline __m256i load2h(const uint8_t* p0, const uint8_t* p1) {  // 16 bytes of each tile
  return _mm256_set_m128i(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p1)),
                          _mm_loadu_si128(reinterpret_cast<const __m128i*>(p0)));
}
MICROSPEC_V512 inline __m512i nib2(const uint8_t* q0, const uint8_t* q1, int c) {  // nib_chunk of both tiles
  const __m512i v = load2(q0 + 32 * (c & 3), q1 + 32 * (c & 3));
  return _mm512_and_si512(c < 4 ? v : _mm512_srli_epi16(v, 4), _mm512_set1_epi8(15));
}
// chunk c of both tiles (T::chunk's bytes): b0, b1 a group's first byte (X8, XQ8_0) or its quants (XQ4_K, XQ6_K)
template <class T>
MICROSPEC_V512 inline __m512i chunk2(const uint8_t* b0, const uint8_t* b1, int c) {
  if constexpr (T::kq == 14) {
    const __m512i h = load2(b0 + 128 + 32 * (c >> 2), b1 + 128 + 32 * (c >> 2)), m = _mm512_set1_epi8(0x30);
    const int b = c & 3;
    const __m512i hb = _mm512_and_si512(b == 0 ? _mm512_slli_epi16(h, 4) : b == 1 ? _mm512_slli_epi16(h, 2)
                                        : b == 2 ? h : _mm512_srli_epi16(h, 2), m);
    return _mm512_or_si512(nib2(b0, b1, c), hb);
  } else if constexpr (T::kq == 12) {
    return nib2(b0, b1, c);
  } else if constexpr (T::sign) {
    return load2(b0 + T::head + 32 * c, b1 + T::head + 32 * c);
  } else {
    __m512i q = nib2(b0 + T::head, b1 + T::head, c);
    if (T::q5) {
      const __m512i hb = _mm512_and_si512(load2(b0 + T::head + 128, b1 + T::head + 128),
                                          _mm512_set1_epi8(char(1 << c)));
      q = _mm512_or_si512(q, c < 4 ? _mm512_slli_epi16(hb, 4 - c) : c > 4 ? _mm512_srli_epi16(hb, c - 4) : hb);
    }
    return q;
  }
}

// Path 2's view of the quantized rows, laid out group by group so that a register tile's rows lie at fixed offsets
// from one pointer (no register per row): q [G][M][32], d, ds, init and offs [G][M].  init is the int32 lanes' start
// for the non-K types: -(128 * sum(qx)) for Q8_0's q + 128 and -(OFF * sum(qx)) for the offset types, so the exact
// group sums come out of the vpdpbusd chain with nothing subtracted after it (the same int32 values, so the same
// results bit for bit); offs is Q6_K's pair of half sums (x8_prep).
struct Wide {
  const int8_t* q;
  const float *d, *ds;
  const int32_t *init, *offs;
  int64_t M;
};

// tile_x8_vnni over two tiles at w0, w1: out[i * 16 + l], row m0 + i against weight row l of the pair
template <class T, int MT>
MICROSPEC_V512 void tile_x16(const Wide& v, int64_t G, const uint8_t* w0, const uint8_t* w1, int64_t m0, float* out,
                             int64_t pf) {
  __m512 acc[MT], accm[MT];
  for (int i = 0; i < MT; ++i) { acc[i] = _mm512_setzero_ps(); accm[i] = _mm512_setzero_ps(); }
  for (int64_t g = 0; g < G; ++g) {
    const uint8_t* b0 = w0 + g * T::gbytes;
    const uint8_t* b1 = w1 + g * T::gbytes;
    const int64_t at = g * v.M + m0;  // row m0's entry of group g
    const int8_t* xg = v.q + 32 * at;
    if (pf) {
      prefetch_group(b0 + pf, T::gbytes);
      prefetch_group(b1 + pf, T::gbytes);
    }
    __m512i t32[MT];
    for (int i = 0; i < MT; ++i)
      t32[i] = T::sign || T::off ? _mm512_set1_epi32(v.init[at + i]) : _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int c = 0; c < 8; ++c) {
      const __m512i wv = chunk2<T>(b0, b1, c);
      const __m512i uw = T::sign ? _mm512_xor_si512(wv, _mm512_set1_epi8(char(0x80))) : wv;  // q + 128
      for (int i = 0; i < MT; ++i) {
        int32_t xs;
        std::memcpy(&xs, xg + 32 * i + 4 * c, 4);
        t32[i] = _mm512_dpbusd_epi32(t32[i], uw, _mm512_set1_epi32(xs));
      }
    }
    const __m512 sv = _mm512_cvtph_ps(load2h(b0, b1));
    const __m512 mm = T::min ? _mm512_cvtph_ps(load2h(b0 + 16, b1 + 16)) : _mm512_setzero_ps();
    for (int i = 0; i < MT; ++i) {
      acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t32[i]), _mm512_mul_ps(sv, _mm512_set1_ps(v.d[at + i])), acc[i]);
      if (T::min) accm[i] = _mm512_fmadd_ps(mm, _mm512_set1_ps(v.ds[at + i]), accm[i]);
    }
  }
  for (int i = 0; i < MT; ++i) _mm512_storeu_ps(out + 16 * i, T::min ? _mm512_add_ps(acc[i], accm[i]) : acc[i]);
}

// tile_k8_vnni over two tile-block rows at w0, w1 (the lanes' sub-block scales and d of both: 16 lanes)
template <class T, int MT>
MICROSPEC_V512 void tile_k16(const Wide& v, int64_t G, const uint8_t* w0, const uint8_t* w1, int64_t m0, float* out,
                             int64_t pf) {
  constexpr bool Q6 = T::kq == 14;
  __m512 acc[MT], accm[MT];
  for (int i = 0; i < MT; ++i) { acc[i] = _mm512_setzero_ps(); accm[i] = _mm512_setzero_ps(); }
  for (int64_t blk = 0; blk < G / 8; ++blk) {
    const uint8_t* B0 = w0 + blk * T::tbytes;
    const uint8_t* B1 = w1 + blk * T::tbytes;
    const __m512 dv = _mm512_cvtph_ps(load2h(B0, B1));
    const __m512 dminv = T::min ? _mm512_cvtph_ps(load2h(B0 + 16, B1 + 16)) : _mm512_setzero_ps();
    for (int j = 0; j < 8; ++j) {
      const int64_t g = blk * 8 + j;
      const int64_t at = g * v.M + m0;
      if (pf) {  // an eighth of the tile-blocks ahead
        prefetch_group(B0 + pf + j * T::tbytes / 8, T::tbytes / 8);
        prefetch_group(B1 + pf + j * T::tbytes / 8, T::tbytes / 8);
      }
      const __m256i sb = load2h(B0 + T::soff + 16 * j, B1 + T::soff + 16 * j);
      const __m512i sx = Q6 ? _mm512_cvtepi8_epi16(sb) : _mm512_cvtepu8_epi16(sb);
      const uint8_t* q0 = B0 + T::qoff + T::qbytes * j;
      const uint8_t* q1 = B1 + T::qoff + T::qbytes * j;
      const int8_t* xg = v.q + 32 * at;
      __m512i s0[MT], s1[MT];
      for (int i = 0; i < MT; ++i) { s0[i] = _mm512_setzero_si512(); s1[i] = _mm512_setzero_si512(); }
#pragma GCC unroll 8
      for (int c = 0; c < 8; ++c) {
        const __m512i wv = chunk2<T>(q0, q1, c);
        for (int i = 0; i < MT; ++i) {
          int32_t xs;
          std::memcpy(&xs, xg + 32 * i + 4 * c, 4);
          if (Q6 && c >= 4) s1[i] = _mm512_dpbusd_epi32(s1[i], wv, _mm512_set1_epi32(xs));
          else s0[i] = _mm512_dpbusd_epi32(s0[i], wv, _mm512_set1_epi32(xs));
        }
      }
      const __m512i sca = Q6 ? _mm512_srai_epi32(_mm512_slli_epi32(sx, 16), 16)
                             : _mm512_and_si512(sx, _mm512_set1_epi32(0xFFFF));
      const __m512i scb = _mm512_srai_epi32(sx, 16);
      const __m512 mf = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(sx, 16)), dminv);  // Q4_K: dmin * m
      for (int i = 0; i < MT; ++i) {
        __m512i p = _mm512_mullo_epi32(s0[i], sca);
        if (Q6) {
          p = _mm512_add_epi32(p, _mm512_mullo_epi32(s1[i], scb));
          p = _mm512_sub_epi32(p, _mm512_slli_epi32(_mm512_madd_epi16(sx, _mm512_set1_epi32(v.offs[at + i])), 5));
        }
        acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(dv, _mm512_set1_ps(v.d[at + i])), acc[i]);
        if (T::min) accm[i] = _mm512_fnmadd_ps(mf, _mm512_set1_ps(v.ds[at + i]), accm[i]);
      }
    }
  }
  for (int i = 0; i < MT; ++i) _mm512_storeu_ps(out + 16 * i, T::min ? _mm512_add_ps(acc[i], accm[i]) : acc[i]);
}

// ---------------------------------------------------------------------------------------------------------------
// Path 3: AMX.  Per group, the 16 weight rows of a pair of tiles, unpacked as path 2 unpacks them (chunk2), are
// stored as the B tile of the tile product (8 rows of 64 bytes: row c holds chunk c, 4 bytes of each weight row) and
// the group's 32 bytes of up to 16 activation rows (path 2's layout, Wide) are the A tile: one tdpbssd (or tdpbsud
// for the unsigned q of the types with a minimum and of Q4_K) gives every (row, weight row) its exact int32 group
// sum.  The weights go in less their offset (q - OFF, signed), so the sums need nothing subtracted: they are the
// same int32 values as path 2's lanes (Q6_K's: sc_a * sum(qx (q - 32)) + sc_b * ..., the same integer as its
// offset-corrected sum), and the fp32 chain after them is path 2's, in the same order: bit for bit its results.
// The tiles pay where the weights need no unpacking (Q8_0, the LM head of the built-in models) and the rows are
// more than path 2 takes in one register tile, or so few that path 2 takes Q8_0 one tile at a time: amx_rows.
#define MICROSPEC_AMX __attribute__((target("avx512f,avx512vl,avx512bw,avx512vnni,avx512dq,amx-tile,amx-int8")))

// A tile configuration (palette 1) for mt activation rows: tiles 0, 1 the A tiles (mt rows of a group's 32 bytes,
// or for Q6_K of a 16-element half's 16), 2, 3 the B tiles (8 rows of 64 bytes, Q6_K 4), 4..7 the C tiles (mt rows
// of 16 int32).
thread_local int t_amx_config = 0;  // the configuration this thread loaded: 2 mt + kind, 0 none

// kind 0: 32-byte A, 64-byte B and C; 1: Q6_K's halves
MICROSPEC_AMX inline void amx_configure(int mt, int kind) {
  const int key = 2 * mt + kind;
  if (t_amx_config == key) return;
  TileConfig c;
  for (int i = 0; i < 8; ++i) {
    c.colsb[i] = i < 2 ? (kind == 1 ? 16 : 32) : 64;
    c.rows[i] = uint8_t(i >= 2 && i < 4 ? (kind == 1 ? 4 : 8) : mt);
  }
  load_tile_config(c);
  t_amx_config = key;
}

MICROSPEC_AMX inline void amx_release() {
  if (t_amx_config) _tile_release();
  t_amx_config = 0;
}

// The 8 chunks of group b0, b1 of a pair of tiles as a B tile at bt (row c: chunk c), signed q - OFF where the type
// has an offset (Q8_0's q are signed already)
template <class T>
MICROSPEC_AMX inline void amx_weights(const uint8_t* b0, const uint8_t* b1, int8_t* bt) {
#pragma GCC unroll 8
  for (int c = 0; c < 8; ++c) {
    __m512i wv = chunk2<T>(b0, b1, c);
    if (!T::sign && T::off) wv = _mm512_sub_epi8(wv, _mm512_set1_epi8(char(T::off)));
    _mm512_store_si512(reinterpret_cast<__m512i*>(bt + 64 * c), wv);
  }
}

// One group's tile product into C tile C: A tile A the activations at x (row stride 32), B tile B the unpacked
// weights at bt; signed weights (q - OFF) or unsigned (q).  A macro: GCC's tile intrinsics paste the tile numbers
// into their assembly, so they must be literal numbers.
#define MICROSPEC_AMX_GROUP(A, B, C, SIGNED, x, bt) \
  do {                                              \
    _tile_loadd(A, x, 32);                          \
    _tile_loadd(B, bt, 64);                         \
    _tile_zero(C);                                  \
    if constexpr (SIGNED) _tile_dpbssd(C, A, B);    \
    else _tile_dpbsud(C, A, B);                     \
  } while (0)

// What both AMX schedules share: where a group lies in a pair of tiles w0, w1, and a group's int32 sums (a C tile
// as stored) through the fp32 chain of rows m0..m0+mt-1, path 2's operations in path 2's order.
// MT: the rows as a constant (their accumulators then stay in registers), 0 for mt's.
template <class T, int MT>
struct AmxGroups {
  static constexpr bool K = T::kq != 0, Q6 = T::kq == 14, S = T::sign || T::off;
  static constexpr int R = MT ? MT : 16;  // the loops' bound
  // the rows (v, m0..m0+mt-1), the pair of tiles (w0, w1: G groups), how far on their prefetch lies (pf bytes)
  const Wide& v;
  int64_t G;
  const uint8_t *w0, *w1;
  int64_t m0;
  int mt;
  int64_t pf;

  // group g's first quant byte (X8, XQ8_0: the group's first byte) in the tile-block row w
  static const uint8_t* quants(const uint8_t* w, int64_t g) {
    if constexpr (K) return w + (g / 8) * T::tbytes + T::qoff + T::qbytes * (g % 8);
    else return w + g * T::gbytes;
  }
  // the bytes the prefetch of group g takes (0: none): its own (X8), or its tile-block's at the block's first group
  static int64_t span(int64_t g) {
    if constexpr (K) return g % 8 == 0 ? T::tbytes : 0;
    else return T::gbytes;
  }
  static int64_t at_byte(int64_t g) {
    if constexpr (K) return (g / 8) * T::tbytes;
    else return g * T::gbytes;
  }

  // group g's sums c0 (row i's 16 lanes at c0 + 16 i; Q6_K's second half 256 on) into acc (and accm)
  MICROSPEC_AMX __attribute__((always_inline)) static inline void chain(const Wide& v, const uint8_t* w0,
                                                                       const uint8_t* w1, int64_t g, int64_t m0,
                                                                       int mt, const int32_t* c0, __m512 (&acc)[16],
                                                                       __m512 (&accm)[16]) {
    const int64_t at = g * v.M + m0;
    if constexpr (K) {
      const uint8_t* B0 = w0 + at_byte(g);
      const uint8_t* B1 = w1 + at_byte(g);
      const int j = int(g % 8);
      const __m512 dv = _mm512_cvtph_ps(load2h(B0, B1));
      const __m512 dminv = T::min ? _mm512_cvtph_ps(load2h(B0 + 16, B1 + 16)) : _mm512_setzero_ps();
      const __m256i sb = load2h(B0 + T::soff + 16 * j, B1 + T::soff + 16 * j);
      const __m512i sx = Q6 ? _mm512_cvtepi8_epi16(sb) : _mm512_cvtepu8_epi16(sb);
      const __m512i sca = Q6 ? _mm512_srai_epi32(_mm512_slli_epi32(sx, 16), 16)
                             : _mm512_and_si512(sx, _mm512_set1_epi32(0xFFFF));
      const __m512i scb = _mm512_srai_epi32(sx, 16);
      const __m512 mf = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(sx, 16)), dminv);  // Q4_K: dmin * m
#pragma GCC unroll 16
      for (int i = 0; i < R; ++i) {
        if (!MT && i >= mt) break;
        __m512i p = _mm512_mullo_epi32(_mm512_load_si512(reinterpret_cast<const __m512i*>(c0 + 16 * i)), sca);
        if (Q6)
          p = _mm512_add_epi32(
              p, _mm512_mullo_epi32(_mm512_load_si512(reinterpret_cast<const __m512i*>(c0 + 256 + 16 * i)), scb));
        acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(dv, _mm512_set1_ps(v.d[at + i])), acc[i]);
        if (T::min) accm[i] = _mm512_fnmadd_ps(mf, _mm512_set1_ps(v.ds[at + i]), accm[i]);
      }
    } else {
      const uint8_t* b0 = w0 + g * T::gbytes;
      const uint8_t* b1 = w1 + g * T::gbytes;
      const __m512 sv = _mm512_cvtph_ps(load2h(b0, b1));
      const __m512 mm = T::min ? _mm512_cvtph_ps(load2h(b0 + 16, b1 + 16)) : _mm512_setzero_ps();
#pragma GCC unroll 16
      for (int i = 0; i < R; ++i) {
        if (!MT && i >= mt) break;
        const __m512i p = _mm512_load_si512(reinterpret_cast<const __m512i*>(c0 + 16 * i));
        acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(sv, _mm512_set1_ps(v.d[at + i])), acc[i]);
        if (T::min) accm[i] = _mm512_fmadd_ps(mm, _mm512_set1_ps(v.ds[at + i]), accm[i]);
      }
    }
  }
};

// Rows m0..m0+mt-1 (mt <= 16, configuration kind 0 loaded) against the pair of tiles w0, w1 on AMX, every type but
// Q6_K: out[i * 16 + l].  The tile registers are not renamed, so a tile is written again only when what last used it
// is long done: group g takes A tile g % 2, B tile 2 + g % 2 and C tile 4 + g % 4, and its stages run in a pipeline
// a group apart, each group in order per lane: the weights of group g + 2 are unpacked (a tile load waits for the
// vector stores of what it reads to leave the core), group g's tile product starts, group g - 1's C tile is
// stored, group g - 3's sums go through the fp32 chain (the vector loads of a C tile wait for its store likewise).
// The weights are prefetched to L2 pf bytes on (the pair after next): the tile products outrun a prefetch to L1.
template <class T, int MT>
struct AmxRot : AmxGroups<T, MT> {
  using B = AmxGroups<T, MT>;
  using B::v, B::G, B::w0, B::w1, B::m0, B::mt, B::pf;
  alignas(64) int8_t bt[3][512];
  alignas(64) int32_t ct[4][256];

  MICROSPEC_AMX __attribute__((always_inline)) inline void unpack(int64_t g) {
    if (pf && B::span(g)) {
      prefetch_group<_MM_HINT_T1>(w0 + B::at_byte(g) + pf, int(B::span(g)));
      prefetch_group<_MM_HINT_T1>(w1 + B::at_byte(g) + pf, int(B::span(g)));
    }
    amx_weights<T>(B::quants(w0, g), B::quants(w1, g), bt[g % 3]);
  }

  MICROSPEC_AMX __attribute__((always_inline)) inline void product(int64_t g) {
    const int8_t* x = v.q + 32 * (g * v.M + m0);
    const int8_t* b = bt[g % 3];
    switch (g & 3) {
      case 0: MICROSPEC_AMX_GROUP(0, 2, 4, B::S, x, b); break;
      case 1: MICROSPEC_AMX_GROUP(1, 3, 5, B::S, x, b); break;
      case 2: MICROSPEC_AMX_GROUP(0, 2, 6, B::S, x, b); break;
      default: MICROSPEC_AMX_GROUP(1, 3, 7, B::S, x, b); break;
    }
  }

  MICROSPEC_AMX __attribute__((always_inline)) inline void store(int64_t g) {
    int32_t* c = ct[g & 3];
    switch (g & 3) {
      case 0: _tile_stored(4, c, 64); break;
      case 1: _tile_stored(5, c, 64); break;
      case 2: _tile_stored(6, c, 64); break;
      default: _tile_stored(7, c, 64); break;
    }
  }

  MICROSPEC_AMX void run(float* out) {
    __m512 acc[16], accm[16];
    for (int i = 0; i < 16; ++i) { acc[i] = _mm512_setzero_ps(); accm[i] = _mm512_setzero_ps(); }
    for (int64_t g = 0; g < std::min<int64_t>(2, G); ++g) unpack(g);
    for (int64_t g = 0; g < G; ++g) {
      if (g + 2 < G) unpack(g + 2);
      product(g);
      if (g >= 1) store(g - 1);
      if (g >= 3) B::chain(v, w0, w1, g - 3, m0, mt, ct[(g - 3) & 3], acc, accm);
    }
    store(G - 1);
    for (int64_t g = std::max<int64_t>(0, G - 3); g < G; ++g) B::chain(v, w0, w1, g, m0, mt, ct[g & 3], acc, accm);
    for (int i = 0; i < mt; ++i) _mm512_storeu_ps(out + 16 * i, T::min ? _mm512_add_ps(acc[i], accm[i]) : acc[i]);
  }
};

// Q6_K's rows on AMX (configuration kind 1): a group is two tile products, one a 16-element half (A tiles 0, 1 the
// halves, B tiles 2, 3, C tiles 4, 5 and 6, 7), so two groups' products are in flight, in batches of two in three
// stages a batch apart: the weights of batch b + 1 are unpacked while batch b's tile products run and batch b - 1's
// sums go through the fp32 chain.
// One Q6_K group's two tile products, a 16-element half each, into C tiles CA, CB: A tiles 0, 1 the halves of the
// activations at x, B tiles 2, 3 the halves of the unpacked weights at bt (literal tile numbers, as above)
#define MICROSPEC_AMX_HALVES(CA, CB, x, bt) \
  do {                                      \
    _tile_loadd(0, x, 32);                  \
    _tile_loadd(1, (x) + 16, 32);           \
    _tile_loadd(2, bt, 64);                 \
    _tile_loadd(3, (bt) + 256, 64);         \
    _tile_zero(CA);                         \
    _tile_zero(CB);                         \
    _tile_dpbssd(CA, 0, 2);                 \
    _tile_dpbssd(CB, 1, 3);                 \
  } while (0)

template <int MT>
struct AmxQ6 : AmxGroups<XQ6_K, MT> {
  using T = XQ6_K;
  using B = AmxGroups<T, MT>;
  using B::v, B::G, B::w0, B::w1, B::m0, B::mt, B::pf;
  static constexpr int NG = 2;
  alignas(64) int8_t bt[2][NG][512];
  alignas(64) int32_t ct[2][2 * NG][256];

  int count(int64_t b) const { return int(std::min<int64_t>(NG, G - b * NG)); }

  MICROSPEC_AMX __attribute__((always_inline)) inline void unpack(int64_t b) {
    for (int k = 0; k < count(b); ++k) {
      const int64_t g = b * NG + k;
      if (pf && B::span(g)) {  // the pair after, a tile-block at a time
        prefetch_group(w0 + B::at_byte(g) + pf, int(B::span(g)));
        prefetch_group(w1 + B::at_byte(g) + pf, int(B::span(g)));
      }
      amx_weights<T>(B::quants(w0, g), B::quants(w1, g), bt[b & 1][k]);
    }
  }

  MICROSPEC_AMX __attribute__((always_inline)) inline void products(int64_t b) {
    const int n = count(b);
    const int8_t* x = v.q + 32 * (b * NG * v.M + m0);
    const int64_t xs = 32 * v.M;  // the next group's rows
    int8_t(*w)[512] = bt[b & 1];
    int32_t(*c)[256] = ct[b & 1];
    MICROSPEC_AMX_HALVES(4, 5, x, w[0]);
    if (n > 1) MICROSPEC_AMX_HALVES(6, 7, x + xs, w[1]);
    _tile_stored(4, c[0], 64);
    _tile_stored(5, c[1], 64);
    if (n > 1) {
      _tile_stored(6, c[2], 64);
      _tile_stored(7, c[3], 64);
    }
  }

  MICROSPEC_AMX __attribute__((always_inline)) inline void chain(int64_t b, __m512 (&acc)[16], __m512 (&accm)[16]) {
    for (int k = 0; k < count(b); ++k) B::chain(v, w0, w1, b * NG + k, m0, mt, ct[b & 1][2 * k], acc, accm);
  }

  MICROSPEC_AMX void run(float* out) {
    __m512 acc[16], accm[16];
    for (int i = 0; i < 16; ++i) { acc[i] = _mm512_setzero_ps(); accm[i] = _mm512_setzero_ps(); }
    const int64_t nb = (G + NG - 1) / NG;
    unpack(0);
    for (int64_t b = 0; b < nb; ++b) {
      products(b);
      if (b + 1 < nb) unpack(b + 1);
      if (b > 0) chain(b - 1, acc, accm);
    }
    chain(nb - 1, acc, accm);
    for (int i = 0; i < mt; ++i) _mm512_storeu_ps(out + 16 * i, acc[i]);
  }
};

// ---------------------------------------------------------------------------------------------------------------
// A call's choices come in its Plan (plan.h): the path, and how many tiles ahead a product taken one tile at a time
// (one row; Q8_0 up to 4 rows: pairs_tiles) prefetches (0: none, the hardware's prefetchers alone; which pays depends
// on the CPU and its neighbours, so cpu_quant.tune_prefetch measures it at a packed model's load).  The pairs of
// path 2 always prefetch the next pair.

// The widest path this CPU has (3 where it has AMX and the process may use it), asked once
int cpu_path() {
  static const int widest = [] {
    __builtin_cpu_init();
    const bool vnni = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
                      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni") &&
                      __builtin_cpu_supports("avx512dq");
    return !vnni ? 0 : amx_permitted(25) ? 3 : 2;  // AMX-INT8
  }();
  return widest;
}

// The path a plan's products take: its own, or AVX2 where the CPU lacks it
int path_of(const microspec::Plan& plan) { return plan.path >= 0 && plan.path <= cpu_path() ? plan.path : 0; }

// pf: how far ahead (bytes) the tile to prefetch lies, 0 for none (a register tile after a tile's first)
template <class T, int MT>
inline void tile_one(const Act& a, const int32_t* offs, const int32_t* sums, const uint8_t* w, int64_t m0,
                     float* out, int path, int64_t pf) {
  if constexpr (T::kq != 0) {
    if (path) tile_k8_vnni<T, MT>(a, offs, w, m0, out, pf);
    else tile_k8<T, MT>(a, offs, w, m0, out, pf);
  } else if (path) tile_x8_vnni<T, MT>(a, offs, sums, w, m0, out, pf);
  else tile_x8<T, MT>(a, offs, w, m0, out, pf);
}

template <class T, int MT>
inline void tile_two(const Wide& v, int64_t G, const uint8_t* w0, const uint8_t* w1, int64_t m0, float* out,
                     int64_t pf) {
  if constexpr (T::kq != 0) tile_k16<T, MT>(v, G, w0, w1, m0, out, pf);
  else tile_x16<T, MT>(v, G, w0, w1, m0, out, pf);
}

// Rows m0..m0+mt-1 (mt <= 8) against tile t (and t + 1 where `two`; pf: see tile_one), written to op [M, N]
template <class T>
inline void rows_tiles(const Act& a, const int32_t* offs, const int32_t* sums, const Wide& v, const uint8_t* wt,
                       int64_t RB, int64_t m0, int64_t mt, bool two, int path, int64_t N, int64_t t, float* op,
                       int64_t pf) {
  float buf[8 * 16];
  if (two) {
    switch (mt) {
      case 8: tile_two<T, 8>(v, a.G, wt, wt + RB, m0, buf, pf); break;
      case 7: tile_two<T, 7>(v, a.G, wt, wt + RB, m0, buf, pf); break;
      case 6: tile_two<T, 6>(v, a.G, wt, wt + RB, m0, buf, pf); break;
      case 5: tile_two<T, 5>(v, a.G, wt, wt + RB, m0, buf, pf); break;
      case 4: tile_two<T, 4>(v, a.G, wt, wt + RB, m0, buf, pf); break;
      case 3: tile_two<T, 3>(v, a.G, wt, wt + RB, m0, buf, pf); break;
      case 2: tile_two<T, 2>(v, a.G, wt, wt + RB, m0, buf, pf); break;
      default: tile_two<T, 1>(v, a.G, wt, wt + RB, m0, buf, pf); break;
    }
    for (int64_t i = 0; i < mt; ++i) std::memcpy(op + (m0 + i) * N + 8 * t, buf + 16 * i, 16 * sizeof(float));
    return;
  }
  switch (mt) {
    case 4: tile_one<T, 4>(a, offs, sums, wt, m0, buf, path, pf); break;
    case 3: tile_one<T, 3>(a, offs, sums, wt, m0, buf, path, pf); break;
    case 2: tile_one<T, 2>(a, offs, sums, wt, m0, buf, path, pf); break;
    default: tile_one<T, 1>(a, offs, sums, wt, m0, buf, path, pf); break;
  }
  for (int64_t i = 0; i < mt; ++i) std::memcpy(op + (m0 + i) * N + 8 * t, buf + 8 * i, 8 * sizeof(float));
}

// Rows m0..m0+mt-1 (mt <= 16) against the pair of tiles t, t + 1 on AMX, written to op [M, N]
template <class T>
MICROSPEC_AMX void rows_amx(const Wide& v, int64_t G, const uint8_t* wt, int64_t RB, int64_t m0, int mt, int64_t N,
                            int64_t t, float* op, int64_t pf) {
  alignas(64) float buf[16 * 16];
  if constexpr (T::kq == 14) {
    if (mt == 16) AmxQ6<16>{{v, G, wt, wt + RB, m0, mt, pf}}.run(buf);
    else AmxQ6<0>{{v, G, wt, wt + RB, m0, mt, pf}}.run(buf);
  } else if (mt == 16) {
    AmxRot<T, 16>{{v, G, wt, wt + RB, m0, mt, pf}}.run(buf);
  } else {
    AmxRot<T, 0>{{v, G, wt, wt + RB, m0, mt, pf}}.run(buf);
  }
  for (int i = 0; i < mt; ++i) std::memcpy(op + (m0 + i) * N + 8 * t, buf + 16 * i, 16 * sizeof(float));
}

// What an interleaved form's integer products need of the quantized rows beyond qx, dx and dxs: per row and group
// OFF * sum(qx) (Q6_K: the two halves' sums as an int16 pair) for the offset types, and sum(qx) for the signed
// types on the VNNI paths; where path 2 pairs the tiles (pairs_tiles), the rows in its layout (Wide).  Made
// once per call, before the tiles are split over the cores.
struct X8Prep {
  std::vector<int32_t> offs, sums;
  std::vector<int8_t> wq;
  std::vector<float> wd, wds;
  std::vector<int32_t> winit, woffs;
  Wide wide(int64_t M) const { return Wide{wq.data(), wd.data(), wds.data(), winit.data(), woffs.data(), M}; }
};

// Whether path 2 pairs the tiles for M rows.  One row streams from memory faster one tile at a time (one stream the
// hardware prefetches), and so does Q8_0 up to 4 rows: its chunks are plain loads, so its products keep up with
// memory there.  The types whose chunks are unpacked (nibbles, fifth bits, K-quants) are bound by instructions from
// 2 rows on, where the pairs halve them.  On a CPU with AMX (path 3: an Intel Xeon, whose 512-bit units are full
// width) they are bound by instructions at one row too, and pair from there.  The measurements behind each bound:
// docs/history.md and benchmarks/results/2026-12-04-pair-one-row/.
template <class T>
inline bool pairs_tiles(int path, int64_t M) {
  constexpr bool plain_loads = T::kq == 0 && T::sign;  // Q8_0
  return path >= 2 && (M > 4 || (!plain_loads && (M > 1 || path == 3)));
}

// Whether path 3 takes M rows of type T on AMX tiles (else path 2 does): from amx_min_rows rows on (1), Q8_0 (its
// weights need no unpacking, only the copy of a pair's halves into one B tile) where the rows are more than one
// paired register tile of path 2 (8) or so few that path 2 takes Q8_0 one tile at a time (up to 4, pairs_tiles):
// where the tiles beat path 2 (the other types, whose weights the vector units unpack either way, do not gain;
// benchmarks/results/2026-12-04-amx-head/).  At 1-4 rows only a matrix of AMX_FEW_ROWS_BYTES or more (bytes: the
// packed matrix's): the tiles' stream pays on a large matrix (the LM head), their fixed costs a call do not on a
// small one (an EAGLE head's; benchmarks/results/2026-12-04-amx-one-row/).
constexpr int64_t AMX_FEW_ROWS_BYTES = int64_t(16) << 20;

template <class T>
inline bool amx_rows(const microspec::Plan& plan, int path, int64_t M, int64_t bytes) {
  if (path != 3 || M < plan.amx_min_rows) return false;
  if (plan.amx_every) return true;
  return T::kq == 0 && T::sign && (M > 8 || (M <= 4 && bytes >= AMX_FEW_ROWS_BYTES));
}

template <class T>
X8Prep x8_prep(const int8_t* qx, const float* dx, const float* dxs, int64_t M, int64_t G,
              const microspec::Plan& plan, int path, int64_t bytes) {
  X8Prep p;
  p.offs.resize(T::off ? M * G : 0);
  for (int64_t i = 0; T::off && i < M * G; ++i) {
    int32_t lo = 0, hi = 0;
    for (int k = 0; k < 16; ++k) { lo += qx[32 * i + k]; hi += qx[32 * i + 16 + k]; }
    p.offs[i] = T::kq == 14 ? int32_t((uint32_t(lo) & 0xFFFFu) | (uint32_t(hi) << 16)) : T::off * (lo + hi);
  }
  p.sums.resize(path && T::kq == 0 && T::sign ? M * G : 0);
  for (int64_t i = 0; i < int64_t(p.sums.size()); ++i) {
    int32_t v = 0;
    for (int k = 0; k < 32; ++k) v += qx[32 * i + k];
    p.sums[i] = v;
  }
  if (pairs_tiles<T>(path, M) || amx_rows<T>(plan, path, M, bytes)) {  // [M][G] -> [G][M]
    p.wq.resize(M * G * 32);
    p.wd.resize(M * G);
    p.wds.resize(T::min ? M * G : 0);  // what the kernels read of each type: tile_x16, tile_k16
    p.winit.resize(T::kq == 0 ? M * G : 0);
    p.woffs.resize(T::kq == 14 ? M * G : 0);
    for (int64_t r = 0; r < M; ++r)
      for (int64_t g = 0; g < G; ++g) {
        const int64_t from = r * G + g, to = g * M + r;
        std::memcpy(&p.wq[32 * to], qx + 32 * from, 32);
        p.wd[to] = dx[from];
        if (T::min) p.wds[to] = dxs[from];
        if (T::kq == 0) p.winit[to] = -(T::sign ? 128 * p.sums[from] : 0) - (T::off ? p.offs[from] : 0);
        if (T::kq == 14) p.woffs[to] = p.offs[from];
      }
  }
  return p;
}

// Tiles tb..te-1 of an interleaved form (`tiles` in all) against the M rows, written to op [M, tiles * 8]: in chunks
// of ~48 KiB (L2), the input rows in blocks of 16 and register tiles of up to 4 rows (8 on path 2 with two tiles at a
// time); the first register tile over a tile prefetches one a few tiles on (the next pair on path 2); each register
// tile unpacks the weights it multiplies, and every weight byte comes from memory once per call.  A tile's results
// do not depend on the range it falls in, nor on the tile beside it.
template <class T>
void x8_tiles(const Act& a, const X8Prep& p, int64_t M, const uint8_t* wp, int64_t tiles, int64_t RB, float* op,
              const microspec::Plan& plan, int path, int64_t tb, int64_t te) {
  const int64_t N = tiles * 8;
  constexpr int64_t MB = 16;
  const bool amx = amx_rows<T>(plan, path, M, tiles * RB), wide = amx || pairs_tiles<T>(path, M);
  const Wide v = p.wide(M);
  const int64_t one_ahead = plan.prefetch_tiles;  // one tile at a time (0: none)
  const int64_t MT = wide ? 8 : 4;
  const int64_t chunk = std::max<int64_t>(2, int64_t(48) * 1024 / RB / 2 * 2);  // whole pairs of tiles
  for (int64_t t0 = tb; t0 < te; t0 += chunk) {
    const int64_t t1 = std::min(te, t0 + chunk);
    for (int64_t mb = 0; mb < M; mb += MB) {
      const int64_t me = std::min(M, mb + MB);
      for (int64_t t = t0; t < t1;) {
        const bool two = wide && t + 1 < t1;
        if (amx && two) {  // all the block's rows in one tile product a group
          amx_configure(int(me - mb), T::kq == 14 ? 1 : 0);
          const int64_t ahead = T::kq == 14 ? 1 : 2;  // the pairs AmxQ6, AmxRot prefetch ahead
          rows_amx<T>(v, a.G, wp + t * RB, RB, mb, int(me - mb), N, t, op,
                      t + 2 * ahead + 1 < tiles ? 2 * ahead * RB : 0);
          t += 2;
          continue;
        }
        const int64_t ahead = two ? 2 : one_ahead;  // the next pair, or a few tiles on
        for (int64_t m0 = mb; m0 < me; m0 += two ? MT : 4)
          rows_tiles<T>(a, p.offs.data(), p.sums.data(), v, wp + t * RB, RB, m0,
                        std::min<int64_t>(two ? MT : 4, me - m0), two, path, N, t, op,
                        ahead && m0 == mb && t + ahead + two < tiles ? ahead * RB : 0);
        t += two ? 2 : 1;
      }
    }
  }
  if (amx) amx_release();
}

// Calls f(tag) with the block type of an interleaved form's type id
template <class F>
void x8_dispatch(int64_t type, F&& f) {
  switch (type) {
    case 1008: f(XQ8_0{}); break;
    case 1002: f(XQ4_0{}); break;
    case 1003: f(XQ4_1{}); break;
    case 1006: f(XQ5_0{}); break;
    case 1007: f(XQ5_1{}); break;
    case 1012: f(XQ4_K{}); break;
    case 1014: f(XQ6_K{}); break;
    default: TORCH_CHECK(false, "GGML type ", type, " is not an interleaved form");
  }
}

}  // namespace

namespace microspec {

// Several interleaved forms against the same quantized rows, in one parallel region: the tiles of all of them, in
// order, are split over the cores by their bytes (each core one contiguous share, a matrix's share rounded to whole
// pairs of tiles), so small matrices (a layer's k and v) neither idle a core nor pay a region of their own, and the
// stream of weight bytes goes on from one matrix into the next.  Each tile's results are what linear_x8 gives it.
void linear_x8_many(const std::vector<X8Job>& jobs, const int8_t* qx, const float* dx, const float* dxs, int64_t M,
                    int64_t K, const Plan& plan) {
  const int64_t G = K / 32;
  const int path = path_of(plan);
  const Act a{qx, dx, dxs, nullptr, K, G};
  std::vector<X8Prep> preps(jobs.size());
  std::vector<int64_t> first(jobs.size() + 1, 0);  // the bytes before each job's tiles
  for (size_t j = 0; j < jobs.size(); ++j) {
    x8_dispatch(jobs[j].type, [&](auto tag) {
      preps[j] = x8_prep<decltype(tag)>(qx, dx, dxs, M, G, plan, path, jobs[j].tiles * jobs[j].RB);
    });
    first[j + 1] = first[j] + jobs[j].tiles * jobs[j].RB;
  }
  const int64_t total = first.back();
  if (total == 0) return;
  // one share per core, but none of under ~16 KiB of weights for one row (a region costs more than it saves there)
  const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), total * M / (16 * 1024)));
  at::parallel_for(0, parts, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t part = p0; part < p1; ++part) {
      const int64_t b0 = total * part / parts, b1 = total * (part + 1) / parts;  // this share's bytes
      for (size_t j = 0; j < jobs.size(); ++j) {
        const X8Job& job = jobs[j];
        // the pairs of tiles whose first byte falls in [b0, b1), as offsets into this job
        auto edge = [&](int64_t b) {
          const int64_t rel = std::clamp<int64_t>(b - first[j], 0, job.tiles * job.RB);
          const int64_t pairs = (rel + 2 * job.RB - 1) / (2 * job.RB);
          return std::min(job.tiles, 2 * pairs);
        };
        const int64_t tb = edge(b0), te = edge(b1);
        if (tb >= te) continue;
        x8_dispatch(job.type, [&](auto tag) {
          x8_tiles<decltype(tag)>(a, preps[j], M, job.w, job.tiles, job.RB, job.out, plan, path, tb, te);
        });
      }
    }
  });
}


void linear_x8(int64_t type, const int8_t* qx, const float* dx, const float* dxs, int64_t M, int64_t K,
               const uint8_t* wp, int64_t tiles, int64_t RB, float* op, const Plan& plan) {
  linear_x8_many({X8Job{type, wp, tiles, RB, op}}, qx, dx, dxs, M, K, plan);
}

}  // namespace microspec

int64_t widest_int_path() { return cpu_path(); }

bool amx_bf16_available() { return amx_bf16_usable(); }
