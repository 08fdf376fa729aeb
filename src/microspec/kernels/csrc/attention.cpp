// Attention of a few query rows over the cached keys; from PASS_ROWS rows on, every query row and head of a key
// group at once (attend_passes: each key and value row read once for all of them, not once per row).  Each row
// visits exactly the keys it may see, in slot order: scores in fp32 (each the same 8-lane fma chain and horizontal
// sum, whichever heads and keys share a pass), e = exp(score - max) (a vectorized expf), a sequential fp32 sum of the
// e's, and per output element a sequential fma chain over the values.  A row's result depends only on its own visible
// keys, not on the other rows of the call nor on masked slots: the one-token decode step and a tree-verify pass agree
// bit for bit.
// q: [H, T, D]; k, v: [G, S, D] with unit stride along D, all bf16 (E = uint16_t) or all fp32 (E = float);
// allowed: [T, S] bool or empty (all visible).
#include "common.h"
#include "quant.h"


namespace {

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

// Software prefetch of the row segment of `n` elements at p, AHEAD key rows before it is read: a key or value row
// of the cache is read once per pass, and the hardware prefetchers stop at every page (4 rows of fp32 keys).
constexpr int64_t AHEAD = 8;
template <typename E>
inline void prefetch_row(const E* p, int64_t n) {
  const char* c = reinterpret_cast<const char*>(p);
  for (int64_t o = 0; o < n * int64_t(sizeof(E)); o += 64) _mm_prefetch(c + o, _MM_HINT_T0);
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
    for (int b = 0; b < KB && n + b + AHEAD < nv; ++b) prefetch_row(kp + vis[n + b + AHEAD] * ks1, D);
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

// The row's scores e[0..nv) -> e^(score - max) in place (exp_ps in 8-lane groups, exp1 for the tail); returns
// 1 / their sequential fp32 sum (0 where the row sees no key).
inline float softmax_row(float* e, int64_t nv) {
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
  return sum > 0.0f ? 1.0f / sum : 0.0f;
}

// The slots of row mrow (S of them; null: all) it may see, in order, into vis; returns how many.
inline int64_t visible_keys(const bool* mrow, int64_t S, int32_t* vis) {
  int64_t nv = 0;
  for (int64_t j = 0; j < S; ++j)
    if (!mrow || mrow[j]) vis[nv++] = int32_t(j);
  return nv;
}

// ---------------------------------------------------------------------------------------------------------------
// The 512-bit form of the score and value chains, which the passes (several query rows) take where the CPU has
// AVX-512 F and DQ and the call's plan asks for it: each register holds two of the 8-lane chains side by side, so
// every value is the same fp32 sequence whichever form computed it, bit for bit (tests/test_cpu_linear.py compares
// the two forms).
// Scores: the low half is head r's chain, the high half head r + 1's, over the same key (its 8 elements broadcast to
// both halves), so one fma serves two heads; values: 16 consecutive output elements a register, each its own chain
// over the keys.  The passes (several rows) are bound by their fmas, which the 512-bit form halves; one row is bound
// by its reads and keeps the 256-bit form (the measurements: docs/history.md, "The attention's passes on 512-bit
// registers").
#define MICROSPEC_ATT512 __attribute__((target("avx512f,avx512dq")))

// Whether the CPU has the 512-bit form, asked once; a call takes it where its plan asks for it (plan.h)
bool cpu_att_wide() {
  static const bool wide = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
  }();
  return wide;
}

constexpr int64_t WIDE_D = 512;  // the widest head the 512-bit scores take (its queries interleaved on the stack)

// 8 elements at p widened to fp32, in both halves of a register; 16 consecutive elements at p, widened
MICROSPEC_ATT512 inline __m512 bcast8(const float* p) { return _mm512_broadcast_f32x8(_mm256_loadu_ps(p)); }
MICROSPEC_ATT512 inline __m512 bcast8(const uint16_t* p) {
  const __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
}
MICROSPEC_ATT512 inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
MICROSPEC_ATT512 inline __m512 load16(const uint16_t* p) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
}

// scores_rows for NP pairs of heads, KB keys at a time: qq holds the pairs' queries interleaved (pair p's 8 elements
// from k of head 2p, then of head 2p + 1, at qq + 2 (p D8 + k)); q the heads' rows, for the scalar tail
template <typename E, int NP, int KB>
MICROSPEC_ATT512 void scores_pairs(const float* q, const float* qq, int64_t D, const E* kp, int64_t ks1,
                                   const int32_t* vis, int64_t nv, float sc, int64_t S, float* scores) {
  const int64_t D8 = D & ~int64_t(7);
  int64_t n = 0;
  for (; n + KB <= nv; n += KB) {
    const E* kr[KB];
    for (int b = 0; b < KB; ++b) kr[b] = kp + vis[n + b] * ks1;
    for (int b = 0; b < KB && n + b + AHEAD < nv; ++b) prefetch_row(kp + vis[n + b + AHEAD] * ks1, D);
    __m512 acc[NP][KB];
    for (int p = 0; p < NP; ++p)
      for (int b = 0; b < KB; ++b) acc[p][b] = _mm512_setzero_ps();
    for (int64_t k = 0; k < D8; k += 8) {
      __m512 kv[KB];
      for (int b = 0; b < KB; ++b) kv[b] = bcast8(kr[b] + k);
      for (int p = 0; p < NP; ++p) {
        const __m512 qv = _mm512_load_ps(qq + 2 * (p * D8 + k));
        for (int b = 0; b < KB; ++b) acc[p][b] = _mm512_fmadd_ps(qv, kv[b], acc[p][b]);
      }
    }
    for (int p = 0; p < NP; ++p)
      for (int b = 0; b < KB; ++b)
        for (int h = 0; h < 2; ++h) {
          const int r = 2 * p + h;
          float s = hsum8(h ? _mm512_extractf32x8_ps(acc[p][b], 1) : _mm512_castps512_ps256(acc[p][b]));
          for (int64_t k = D8; k < D; ++k) s += q[r * D + k] * to_f32(kr[b][k]);
          scores[r * S + n + b] = s * sc;
        }
  }
  for (; n < nv; ++n)  // the last keys, one at a time (the same chain per dot)
    scores_pairs<E, NP, 1>(q, qq, D, kp, ks1, vis + n, 1, sc, S, scores + n);
}

// scores_heads in the 512-bit form (NH >= 2, D <= WIDE_D): the heads in pairs, an odd last one on 256 bits
template <typename E, int NH>
MICROSPEC_ATT512 void scores_heads_wide(const float* q, int64_t D, const E* kp, int64_t ks1, const int32_t* vis,
                                        int64_t nv, float sc, int64_t S, float* scores) {
  constexpr int NP = NH / 2;
  const int64_t D8 = D & ~int64_t(7);
  alignas(64) float qq[2 * NP * WIDE_D];
  for (int p = 0; p < NP; ++p)
    for (int64_t k = 0; k < D8; k += 8) {
      std::memcpy(qq + 2 * (p * D8 + k), q + 2 * p * D + k, 8 * sizeof(float));
      std::memcpy(qq + 2 * (p * D8 + k) + 8, q + (2 * p + 1) * D + k, 8 * sizeof(float));
    }
  scores_pairs<E, NP, (NP >= 2 ? 4 : 8)>(q, qq, D, kp, ks1, vis, nv, sc, S, scores);
  if (NH % 2) scores_rows<E, 1, 8>(q + (NH - 1) * D, D, kp, ks1, vis, nv, sc, S, scores + (NH - 1) * S);
}

// scores_rows for NH heads of one row, as many keys at a time as their registers allow (wide: the 512-bit form for
// two heads or more)
template <typename E, int NH>
void scores_heads(const float* q, int64_t D, const E* kp, int64_t ks1, const int32_t* vis, int64_t nv, float sc,
                  int64_t S, float* scores, bool wide = false) {
  if constexpr (NH >= 2) {
    if (wide && D <= WIDE_D) return scores_heads_wide<E, NH>(q, D, kp, ks1, vis, nv, sc, S, scores);
  }
  scores_rows<E, NH, (NH >= 4 ? 2 : 8 / NH)>(q, D, kp, ks1, vis, nv, sc, S, scores);
}

// The value chains of NH heads of one query row (the same visible keys) for keys n0..n1: CH * 8 elements of d from
// d0, acc[r * W + i] = fma(e_n, v_n[d0 + i], acc[r * W + i]) over n in order, the heads sharing each value load; the
// accumulators come from and go back to acc, so that a chain resumes where an earlier block of keys left it.  The
// value row `ahead` keys on is prefetched, the same columns, as each is read.
template <typename E, int NH, int CH>
inline void pv_keys(const float* const* e, const E* vp, int64_t vs1, const int32_t* vis, int64_t n0, int64_t n1,
                    int64_t nv, int64_t d0, float* acc, int64_t W, int64_t ahead) {
  __m256 a[NH][CH];
  for (int r = 0; r < NH; ++r)
    for (int u = 0; u < CH; ++u) a[r][u] = _mm256_loadu_ps(acc + r * W + 8 * u);
  for (int64_t n = n0; n < n1; ++n) {
    const E* vr = vp + vis[n] * vs1 + d0;
    if (n + ahead < nv) prefetch_row(vp + vis[n + ahead] * vs1 + d0, 8 * CH);
    __m256 vv[CH];
    for (int u = 0; u < CH; ++u) vv[u] = load8(vr + 8 * u);
    for (int r = 0; r < NH; ++r) {
      const __m256 ev = _mm256_set1_ps(e[r][n]);
      for (int u = 0; u < CH; ++u) a[r][u] = _mm256_fmadd_ps(ev, vv[u], a[r][u]);
    }
  }
  for (int r = 0; r < NH; ++r)
    for (int u = 0; u < CH; ++u) _mm256_storeu_ps(acc + r * W + 8 * u, a[r][u]);
}

// out rows of NH heads of one query row (the same visible keys): out[d] = (sum_n e_n v_n[d]) * inv, CH * 8 elements
// of d from d0, one pv_keys chain over all the keys per element from 0.
template <typename E, int NH, int CH>
inline void pv_heads(const float* const* e, const E* vp, int64_t vs1, const int32_t* vis, int64_t nv, int64_t d0,
                     const float* inv, E* const* orow) {
  alignas(32) float o[NH * 8 * CH] = {};
  pv_keys<E, NH, CH>(e, vp, vs1, vis, 0, nv, nv, d0, o, 8 * CH, AHEAD);
  for (int r = 0; r < NH; ++r)
    for (int i = 0; i < 8 * CH; ++i) store_f32(orow[r] + d0 + i, o[r * 8 * CH + i] * inv[r]);
}

// pv_heads in the 512-bit form: CZ * 16 elements of d from d0, the same chain per element
template <typename E, int NH, int CZ>
MICROSPEC_ATT512 void pv_heads16(const float* const* e, const E* vp, int64_t vs1, const int32_t* vis, int64_t nv,
                                 int64_t d0, const float* inv, E* const* orow) {
  __m512 acc[NH][CZ];
  for (int r = 0; r < NH; ++r)
    for (int u = 0; u < CZ; ++u) acc[r][u] = _mm512_setzero_ps();
  for (int64_t n = 0; n < nv; ++n) {
    const E* vr = vp + vis[n] * vs1 + d0;
    if (n + AHEAD < nv) prefetch_row(vp + vis[n + AHEAD] * vs1 + d0, 16 * CZ);
    __m512 vv[CZ];
    for (int u = 0; u < CZ; ++u) vv[u] = load16(vr + 16 * u);
    for (int r = 0; r < NH; ++r) {
      const __m512 ev = _mm512_set1_ps(e[r][n]);
      for (int u = 0; u < CZ; ++u) acc[r][u] = _mm512_fmadd_ps(ev, vv[u], acc[r][u]);
    }
  }
  alignas(64) float o[16 * CZ];
  for (int r = 0; r < NH; ++r) {
    for (int u = 0; u < CZ; ++u) _mm512_store_ps(o + 16 * u, acc[r][u]);
    for (int i = 0; i < 16 * CZ; ++i) store_f32(orow[r] + d0 + i, o[i] * inv[r]);
  }
}

// nd * 8 elements of d from d0 (nd <= 4); wide: pairs of 8 in the 512-bit form, an odd last 8 on 256 bits
template <typename E, int NH>
void pv_chunk(const float* const* e, const E* vp, int64_t vs1, const int32_t* vis, int64_t nv, int64_t d0, int nd,
              const float* inv, E* const* orow, bool wide) {
  if (wide && nd >= 2) {
    if (nd >= 4) pv_heads16<E, NH, 2>(e, vp, vs1, vis, nv, d0, inv, orow);
    else pv_heads16<E, NH, 1>(e, vp, vs1, vis, nv, d0, inv, orow);
    const int done = nd >= 4 ? 4 : 2;
    if (nd > done) pv_heads<E, NH, 1>(e, vp, vs1, vis, nv, d0 + 8 * done, inv, orow);
    return;
  }
  switch (nd) {
    case 4: pv_heads<E, NH, 4>(e, vp, vs1, vis, nv, d0, inv, orow); break;
    case 3: pv_heads<E, NH, 3>(e, vp, vs1, vis, nv, d0, inv, orow); break;
    case 2: pv_heads<E, NH, 2>(e, vp, vs1, vis, nv, d0, inv, orow); break;
    default: pv_heads<E, NH, 1>(e, vp, vs1, vis, nv, d0, inv, orow); break;
  }
}

// The output elements past the last 8 lanes (d from D8 to D) of nh heads: the same sequential chain, scalar.
template <typename E>
void pv_tail(const float* const* e, const E* vp, int64_t vs1, const int32_t* vis, int64_t nv, int64_t D8, int64_t D,
             int nh, const float* inv, E* const* orow) {
  for (int r = 0; r < nh; ++r)
    for (int64_t d = D8; d < D; ++d) {
      float a = 0.0f;
      for (int64_t n = 0; n < nv; ++n) a += e[r][n] * to_f32(vp[vis[n] * vs1 + d]);
      store_f32(orow[r] + d, a * inv[r]);
    }
}

constexpr int64_t KEY_BLOCK = 32;  // keys a work item scores (their rows stay in L1 while every query row reads them)
constexpr int64_t D_CHUNK = 32;    // output elements a work item sums (its value columns stay in L2 across the rows)

constexpr int64_t PV_KEYS = 32;  // keys whose value rows a blocked output pass keeps in L1 (pv_blocked)

// pv_heads' outputs for d in [0, D8) (a multiple of 8) of NH heads of one query row, by blocks of PV_KEYS keys: each
// block's value rows come from memory once and serve every column chunk and head from L1, where one pass a chunk
// over all the keys reads every value row again from farther away for each chunk and head (at 1,200 keys a layer's
// values no longer fit a core's L2).  Per element the same sequential fma chain over the keys in order, from 0, then
// times inv: pv_heads' values bit for bit.  acc: NH * D8 floats of scratch.
template <typename E, int NH>
void pv_blocked(const float* const* e, const E* vp, int64_t vs1, const int32_t* vis, int64_t nv, int64_t D8,
                const float* inv, E* const* orow, float* acc) {
  std::fill(acc, acc + NH * D8, 0.0f);
  for (int64_t n0 = 0; n0 < nv; n0 += PV_KEYS) {
    const int64_t n1 = std::min(nv, n0 + PV_KEYS);
    for (int64_t d0 = 0; d0 < D8; d0 += 32) {
      float* ad = acc + d0;
      switch (std::min<int64_t>(4, (D8 - d0) / 8)) {
        case 4: pv_keys<E, NH, 4>(e, vp, vs1, vis, n0, n1, nv, d0, ad, D8, PV_KEYS); break;
        case 3: pv_keys<E, NH, 3>(e, vp, vs1, vis, n0, n1, nv, d0, ad, D8, PV_KEYS); break;
        case 2: pv_keys<E, NH, 2>(e, vp, vs1, vis, n0, n1, nv, d0, ad, D8, PV_KEYS); break;
        default: pv_keys<E, NH, 1>(e, vp, vs1, vis, n0, n1, nv, d0, ad, D8, PV_KEYS); break;
      }
    }
  }
  for (int r = 0; r < NH; ++r)
    for (int64_t i = 0; i < D8; ++i) store_f32(orow[r] + i, acc[r * D8 + i] * inv[r]);
}

// NH heads of one query row over its visible keys, in one work item: the scores, per head the softmax, then the
// outputs two heads at a time (pv_blocked: they share each value load) and the scalar tail.  acc: NH * D floats.
template <typename E, int NH>
void attend_heads(const float* qf, const E* kp, const E* vp, int64_t ks1, int64_t vs1, const int32_t* vis, int64_t nv,
                  int64_t D, int64_t S, float sc, float* scores, E* const* orow, float* acc) {
  scores_heads<E, NH>(qf, D, kp, ks1, vis, nv, sc, S, scores);
  const int64_t D8 = D & ~int64_t(7);
  const float* e[NH];
  float inv[NH];
  for (int r = 0; r < NH; ++r) {
    e[r] = scores + r * S;
    inv[r] = softmax_row(scores + r * S, nv);
  }
  for (int r = 0; r < NH; r += 2) {
    if (r + 1 < NH) pv_blocked<E, 2>(e + r, vp, vs1, vis, nv, D8, inv + r, orow + r, acc);
    else pv_blocked<E, 1>(e + r, vp, vs1, vis, nv, D8, inv + r, orow + r, acc);
  }
  for (int r = 0; r < NH; ++r) pv_tail(e + r, vp, vs1, vis, nv, D8, D, 1, inv + r, orow + r);
}

constexpr int HC = 2;  // heads per work item (decode: Gemma's 4 heads of one group make 2 items for 2 cores)

// A few rows: a work item is one query row and up to HC heads of one key group (they share every key and value
// row it reads), all of it in one parallel pass.
template <typename E>
void attend_items(const E* qp, const E* kp, const E* vp, const bool* mp, E* op, int64_t H, int64_t T, int64_t D,
                 int64_t S, int64_t ks0, int64_t ks1, int64_t vs0, int64_t vs1, int64_t rep, float sc) {
  const int64_t G = H / rep, nc = (rep + HC - 1) / HC;
  at::parallel_for(0, G * nc * T, 1, [&](int64_t b0, int64_t b1) {
    std::vector<float> qf(HC * D), scores(HC * std::max<int64_t>(S, 1)), acc(HC * D);
    std::vector<int32_t> vis(std::max<int64_t>(S, 1));
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t t = b % T, c = (b / T) % nc, g = b / (T * nc);
      const int64_t h0 = g * rep + c * HC, nh = std::min<int64_t>(HC, rep - c * HC);
      const int64_t nv = visible_keys(mp ? mp + t * S : nullptr, S, vis.data());
      E* orow[HC];
      for (int64_t r = 0; r < nh; ++r) {
        const E* qrow = qp + ((h0 + r) * T + t) * D;
        for (int64_t d = 0; d < D; ++d) qf[r * D + d] = to_f32(qrow[d]);
        orow[r] = op + ((h0 + r) * T + t) * D;
      }
      const E* kg = kp + g * ks0;
      const E* vg = vp + g * vs0;
      if (nh == 2)
        attend_heads<E, 2>(qf.data(), kg, vg, ks1, vs1, vis.data(), nv, D, S, sc, scores.data(), orow, acc.data());
      else attend_heads<E, 1>(qf.data(), kg, vg, ks1, vs1, vis.data(), nv, D, S, sc, scores.data(), orow, acc.data());
    }
  });
}

// Three passes over the keys and values of each key group, each split over the cores: (1) the scores of every query
// row and head, by blocks of keys (every key row read once from memory, then from cache by every query row and head:
// up to 4 heads of a row share each key load); (2) per row and head, the max, e = exp(score - max) and their
// sequential sum; (3) the outputs, by chunks of D_CHUNK elements (every value row read once; 2 heads of a row share
// each value load).  Every value is the same fp32 sequence whichever pass, block or chunk computes it.
template <typename E>
void attend_passes(const E* qp, const E* kp, const E* vp, const bool* mp, E* op, int64_t H, int64_t T, int64_t D,
                   int64_t S, int64_t ks0, int64_t ks1, int64_t vs0, int64_t vs1, int64_t rep, float sc, bool wide) {
  const int64_t G = H / rep, Sb = std::max<int64_t>(S, 1), D8 = D & ~int64_t(7);
  // wide: the 512-bit form (where the CPU has it): the passes are bound by their fmas
  // query rows as fp32, [T, H, D] (the heads of a row at stride D); per row its visible keys in slot order
  std::vector<float> qf(T * H * D);
  for (int64_t h = 0; h < H; ++h)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t d = 0; d < D; ++d) qf[(t * H + h) * D + d] = to_f32(qp[(h * T + t) * D + d]);
  std::vector<int32_t> vis(T * Sb);
  std::vector<int64_t> nvis(T);
  for (int64_t t = 0; t < T; ++t) nvis[t] = visible_keys(mp ? mp + t * S : nullptr, S, vis.data() + t * Sb);
  std::vector<float> e(T * H * Sb), inv(T * H);  // scores, then e, by [T, H, visible key]
  const int64_t nkb = (S + KEY_BLOCK - 1) / KEY_BLOCK;
  at::parallel_for(0, G * nkb, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t g = b / nkb, j0 = (b % nkb) * KEY_BLOCK, j1 = std::min(S, j0 + KEY_BLOCK);
      const E* kg = kp + g * ks0;
      for (int64_t t = 0; t < T; ++t) {
        const int32_t* vt = vis.data() + t * Sb;
        const int64_t a = std::lower_bound(vt, vt + nvis[t], int32_t(j0)) - vt;
        const int64_t z = std::lower_bound(vt + a, vt + nvis[t], int32_t(j1)) - vt;
        if (z <= a) continue;
        for (int64_t h0 = g * rep; h0 < (g + 1) * rep; h0 += 4) {
          const int nh = int(std::min<int64_t>(4, (g + 1) * rep - h0));
          const float* q = qf.data() + (t * H + h0) * D;
          float* sp = e.data() + (t * H + h0) * Sb + a;
          switch (nh) {
            case 4: scores_heads<E, 4>(q, D, kg, ks1, vt + a, z - a, sc, Sb, sp, wide); break;
            case 3: scores_heads<E, 3>(q, D, kg, ks1, vt + a, z - a, sc, Sb, sp, wide); break;
            case 2: scores_heads<E, 2>(q, D, kg, ks1, vt + a, z - a, sc, Sb, sp, wide); break;
            default: scores_heads<E, 1>(q, D, kg, ks1, vt + a, z - a, sc, Sb, sp, wide); break;
          }
        }
      }
    }
  });
  at::parallel_for(0, T * H, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) inv[r] = softmax_row(e.data() + r * Sb, nvis[r / H]);
  });
  const int64_t nch = std::max<int64_t>(1, (D8 + D_CHUNK - 1) / D_CHUNK);  // chunk 0 also sums the scalar tail
  at::parallel_for(0, G * nch, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t g = c / nch, d0 = (c % nch) * D_CHUNK, nd = std::min<int64_t>(D_CHUNK, D8 - d0) / 8;
      const E* vg = vp + g * vs0;
      for (int64_t t = 0; t < T; ++t) {
        const int32_t* vt = vis.data() + t * Sb;
        const int64_t nv = nvis[t];
        for (int64_t h0 = g * rep; h0 < (g + 1) * rep; h0 += 2) {
          const int nh = int(std::min<int64_t>(2, (g + 1) * rep - h0));
          const float* er[2] = {e.data() + (t * H + h0) * Sb, e.data() + (t * H + h0 + nh - 1) * Sb};
          E* orow[2] = {op + (h0 * T + t) * D, op + ((h0 + nh - 1) * T + t) * D};
          const float* iv = inv.data() + t * H + h0;
          if (nd > 0) {
            if (nh == 2) pv_chunk<E, 2>(er, vg, vs1, vt, nv, d0, int(nd), iv, orow, wide);
            else pv_chunk<E, 1>(er, vg, vs1, vt, nv, d0, int(nd), iv, orow, wide);
          }
          if (d0 == 0) pv_tail(er, vg, vs1, vt, nv, D8, D, nh, iv, orow);
        }
      }
    }
  });
}

// Rows from which the three passes (each key and value row read once for every row and head) beat one pass of
// (row, heads) items (each reading every key and value row again): the passes' two extra parallel regions cost more
// than they save for a decode step's single row.
constexpr int64_t PASS_ROWS = 2;

template <typename E>
void attend_impl(const E* qp, const E* kp, const E* vp, const bool* mp, E* op, int64_t H, int64_t T, int64_t D,
                 int64_t S, int64_t ks0, int64_t ks1, int64_t vs0, int64_t vs1, int64_t rep, float sc, bool wide) {
  if (T >= PASS_ROWS) attend_passes(qp, kp, vp, mp, op, H, T, D, S, ks0, ks1, vs0, vs1, rep, sc, wide);
  else attend_items(qp, kp, vp, mp, op, H, T, D, S, ks0, ks1, vs0, vs1, rep, sc);
}

// One query row of each of several sequences (a batch's decode steps), each over its own keys: one parallel pass over
// (sequence, key group, up to 4 heads) items — a group's key and value rows read once for its heads, and one
// parallel region for the batch instead of one a sequence; with fewer such items than threads (one sequence's
// decode step), up to HC heads an item, as attend_items splits them.  Each head's values are those attend_items
// computes for the row alone (the same chains: a score per key, the softmax, the value sums do not depend on the
// heads beside it).
void attend_seq_items(const std::vector<RowAttention>& rows, int64_t H, int64_t D, int64_t rep, float sc) {
  constexpr int64_t HQ = 4;  // the most heads an item takes
  const int64_t n = int64_t(rows.size()), G = H / rep;
  const int64_t HG = n * G * ((rep + HQ - 1) / HQ) >= at::get_num_threads() ? HQ : HC;  // heads an item takes
  const int64_t nc = (rep + HG - 1) / HG;
  int64_t Smax = 1;
  for (const RowAttention& r : rows) Smax = std::max(Smax, r.S);
  at::parallel_for(0, n * G * nc, 1, [&](int64_t b0, int64_t b1) {
    std::vector<float> qf(HG * D), scores(HG * Smax), acc(HG * D);
    std::vector<int32_t> vis(Smax);
    for (int64_t b = b0; b < b1; ++b) {
      const RowAttention& row = rows[b / (G * nc)];
      const int64_t g = (b / nc) % G, c = b % nc;
      const int64_t h0 = g * rep + c * HG, nh = std::min<int64_t>(HG, rep - c * HG);
      const int64_t nv = visible_keys(row.allowed, row.S, vis.data());
      float* orow[HQ];
      for (int64_t r = 0; r < nh; ++r) {
        const float* qrow = row.q + (h0 + r) * D;
        for (int64_t d = 0; d < D; ++d) qf[r * D + d] = qrow[d];
        orow[r] = row.out + (h0 + r) * D;
      }
      const float* kg = row.k + g * row.ks0;
      const float* vg = row.v + g * row.vs0;
      const int64_t k1 = row.ks1, v1 = row.vs1, S = row.S;
      switch (nh) {
        case 4: attend_heads<float, 4>(qf.data(), kg, vg, k1, v1, vis.data(), nv, D, S, sc, scores.data(), orow,
                                       acc.data()); break;
        case 3: attend_heads<float, 3>(qf.data(), kg, vg, k1, v1, vis.data(), nv, D, S, sc, scores.data(), orow,
                                       acc.data()); break;
        case 2: attend_heads<float, 2>(qf.data(), kg, vg, k1, v1, vis.data(), nv, D, S, sc, scores.data(), orow,
                                       acc.data()); break;
        default: attend_heads<float, 1>(qf.data(), kg, vg, k1, v1, vis.data(), nv, D, S, sc, scores.data(), orow,
                                        acc.data());
      }
    }
  });
}

}  // namespace

void attend_row_ptrs(const std::vector<RowAttention>& rows, int64_t H, int64_t D, int64_t G, double scale) {
  TORCH_CHECK(G > 0 && H % G == 0, "attend_row_ptrs: heads a multiple of the key groups");
  if (!rows.empty()) attend_seq_items(rows, H, D, H / G, static_cast<float>(scale));
}

// attend_rows of several single query rows, each q [H, 1, D] over its own k, v [G, S_j, D] and allowed [1, S_j] (or
// empty), fp32, in one parallel pass (attend_seq_items): each output [H, 1, D] bit for bit attend_rows' alone.
std::vector<torch::Tensor> attend_rows_many(std::vector<torch::Tensor> qs, std::vector<torch::Tensor> ks,
                                            std::vector<torch::Tensor> vs, std::vector<torch::Tensor> alloweds,
                                            double scale) {
  const size_t n = qs.size();
  TORCH_CHECK(n > 0 && ks.size() == n && vs.size() == n && alloweds.size() == n,
              "attend_rows_many: a key, value and mask tensor per query row");
  std::vector<RowAttention> rows(n);
  std::vector<torch::Tensor> outs(n);
  const int64_t H = qs[0].size(0), D = qs[0].size(2), G = ks[0].size(0);
  TORCH_CHECK(G > 0 && H % G == 0, "attend_rows_many: heads a multiple of the key groups");
  for (size_t j = 0; j < n; ++j) {
    qs[j] = qs[j].contiguous();
    const torch::Tensor &q = qs[j], &k = ks[j], &v = vs[j], &m = alloweds[j];
    TORCH_CHECK(q.scalar_type() == torch::kFloat32 && k.scalar_type() == torch::kFloat32 &&
                v.scalar_type() == torch::kFloat32, "attend_rows_many: fp32 q, k, v");
    TORCH_CHECK(q.dim() == 3 && q.size(0) == H && q.size(1) == 1 && q.size(2) == D && k.dim() == 3 && v.dim() == 3 &&
                k.size(0) == G && v.size(0) == G && k.size(2) == D && v.size(2) == D && v.size(1) == k.size(1) &&
                k.stride(2) == 1 && v.stride(2) == 1, "attend_rows_many: q [H, 1, D], k and v [G, S, D]");
    const int64_t S = k.size(1);
    const bool has_mask = m.defined() && m.numel() > 0;
    if (has_mask)
      TORCH_CHECK(m.dtype() == torch::kBool && m.is_contiguous() && m.dim() == 2 && m.size(0) == 1 &&
                  m.size(1) == S, "attend_rows_many: allowed, contiguous bool [1, S]");
    outs[j] = torch::empty({H, 1, D}, q.options());
    rows[j] = RowAttention{q.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(),
                           has_mask ? m.data_ptr<bool>() : nullptr, outs[j].data_ptr<float>(), S, k.stride(0),
                           k.stride(1), v.stride(0), v.stride(1)};
  }
  attend_row_ptrs(rows, H, D, G, scale);
  return outs;
}

torch::Tensor attend_rows(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor allowed, double scale,
                          int64_t plan) {
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
  const bool wide = microspec::Plan::of(plan).att_wide && cpu_att_wide();
  if (dt == torch::kBFloat16) {
    auto ptr = [](torch::Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr<at::BFloat16>()); };
    attend_impl<uint16_t>(ptr(q), ptr(k), ptr(v), mp, ptr(out), H, T, D, S, k.stride(0), k.stride(1), v.stride(0),
                          v.stride(1), H / G, sc, wide);
  } else {
    attend_impl<float>(q.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(), mp, out.data_ptr<float>(), H,
                       T, D, S, k.stride(0), k.stride(1), v.stride(0), v.stride(1), H / G, sc, wide);
  }
  return out;
}

bool attention_wide_available() { return cpu_att_wide(); }
