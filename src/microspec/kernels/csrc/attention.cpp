// Attention of a few query rows over the cached keys.  A work item is one query row and up to HC heads of one key
// group (they share every key and value row it reads); it visits exactly the keys the row may see, in slot order:
// scores in fp32 (each the same 8-lane fma chain and horizontal sum, whichever heads and keys share a pass),
// e = exp(score - max) (a vectorized expf), a sequential fp32 sum of the e's, and per output element a sequential
// fma chain over the values.  A row's result depends only on its own visible keys, not on the other rows of the
// call nor on masked slots: the one-token decode step and a tree-verify pass agree bit for bit.
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

}  // namespace

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
