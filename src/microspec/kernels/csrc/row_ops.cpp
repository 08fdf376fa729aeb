// ---------------------------------------------------------------------------------------------------------------
// Row-wise fp32 operations of the decode step, one call each instead of torch's chain of small ops (on a 2-core CPU
// a step of a small model spends more time dispatching those than multiplying).  Each row is computed alone, in a
// fixed order: batch-invariant like the products.
// Also argmax_f32, the first index of a vector's largest value (the greedy pick over the logits), and bitmask_fill,
// a grammar's mask on the logits.
#include "common.h"
#include "quant.h"

namespace {
// 1 / sqrt(mean(x^2) + eps) of the row xr [d] (fp32 or bf16): the squares summed in 8 fp32 lanes, then the tail
template <class E>
float inv_rms(const E* xr, int64_t d, double eps) {
  const int64_t d8 = d & ~int64_t(7);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t k = 0; k < d8; k += 8) {
    const __m256 v = load8(xr + k);
    acc = _mm256_add_ps(acc, _mm256_mul_ps(v, v));
  }
  float ss = hsum8(acc);
  for (int64_t k = d8; k < d; ++k) ss += to_f32(xr[k]) * to_f32(xr[k]);
  return 1.0f / std::sqrt(ss / float(d) + float(eps));
}
}  // namespace

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
      const float inv = inv_rms(xr, d, eps);
      const __m256 iv = _mm256_set1_ps(inv);
      for (int64_t k = 0; k < d8; k += 8)
        _mm256_storeu_ps(yr + k, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(xr + k), iv), _mm256_loadu_ps(wp + k)));
      for (int64_t k = d8; k < d; ++k) yr[k] = (xr[k] * inv) * wp[k];
    }
  });
  return out;
}

// rms_norm of bf16 rows x [R, d] (a bf16 model's norms), RMSNorm's two conventions in its roundings: Gemma's
// bf16((x * inv) * w) with w its fp32 effective weight 1 + w; Llama's bf16(w * bf16(x * inv)) with w the bf16 weight.
// inv = 1 / sqrt(mean(x^2) + eps), the mean in rms_norm's order; one row at a time.
torch::Tensor rms_norm_bf16(torch::Tensor x, torch::Tensor w, double eps, bool gemma) {
  TORCH_CHECK(x.dtype() == torch::kBFloat16 && w.dim() == 1 &&
              w.dtype() == (gemma ? torch::kFloat32 : torch::kBFloat16),
              "bf16 x; w: the fp32 effective weight (Gemma) or the bf16 weight");
  x = x.contiguous();
  w = w.contiguous();
  const int64_t d = w.size(0);
  TORCH_CHECK(x.size(-1) == d, "x's last dimension differs from w's");
  const int64_t R = x.numel() / d;
  auto out = torch::empty_like(x);
  const uint16_t* xp = reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>());
  uint16_t* op = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  const float* wf = gemma ? w.data_ptr<float>() : nullptr;
  const uint16_t* wb = gemma ? nullptr : reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>());
  at::parallel_for(0, R, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const uint16_t* xr = xp + r * d;
      uint16_t* yr = op + r * d;
      const float inv = inv_rms(xr, d, eps);
      for (int64_t k = 0; k < d; ++k) {
        const float n = bf16_to_f32(xr[k]) * inv;
        yr[k] = gemma ? f32_to_bf16(n * wf[k]) : f32_to_bf16(bf16_to_f32(wb[k]) * bf16_to_f32(f32_to_bf16(n)));
      }
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

namespace {
// The first index of the largest value of p[0..n) (-1 if there is a NaN: has_nan set), and that value: one pass for
// the maximum through four independent max chains (32 values an iteration), one for its first index.  The maximum of
// a set does not depend on the order it is taken in (a -0 / +0 tie compares equal in the index pass).
int64_t argmax_part(const float* p, int64_t n, float& m, bool& has_nan) {
  const int64_t n8 = n & ~int64_t(7), n32 = n & ~int64_t(31);
  __m256 mx[4], nan[4];
  for (int u = 0; u < 4; ++u) { mx[u] = _mm256_set1_ps(-INFINITY); nan[u] = _mm256_setzero_ps(); }
  for (int64_t i = 0; i < n32; i += 32)
    for (int u = 0; u < 4; ++u) {
      const __m256 v = _mm256_loadu_ps(p + i + 8 * u);
      mx[u] = _mm256_max_ps(mx[u], v);
      nan[u] = _mm256_or_ps(nan[u], _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    }
  for (int64_t i = n32; i < n8; i += 8) {
    const __m256 v = _mm256_loadu_ps(p + i);
    mx[0] = _mm256_max_ps(mx[0], v);
    nan[0] = _mm256_or_ps(nan[0], _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  }
  const __m256 mx4 = _mm256_max_ps(_mm256_max_ps(mx[0], mx[1]), _mm256_max_ps(mx[2], mx[3]));
  const __m256 nan4 = _mm256_or_ps(_mm256_or_ps(nan[0], nan[1]), _mm256_or_ps(nan[2], nan[3]));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, mx4);
  m = lanes[0];
  for (int j = 1; j < 8; ++j) m = std::max(m, lanes[j]);
  has_nan = _mm256_movemask_ps(nan4) != 0;
  for (int64_t i = n8; i < n; ++i) { if (std::isnan(p[i])) has_nan = true; else m = std::max(m, p[i]); }
  if (has_nan) return -1;
  const __m256 mv = _mm256_set1_ps(m);
  for (int64_t i = 0; i < n8; i += 8) {
    const int mask = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(p + i), mv, _CMP_EQ_OQ));
    if (mask) return i + __builtin_ctz(mask);
  }
  for (int64_t i = n8; i < n; ++i) if (p[i] == m) return i;
  return 0;  // unreachable: m is one of the values
}

constexpr int64_t ARGMAX_PART = 32768;  // values from which a part of the vector goes to a core of its own
}  // namespace

// Index of the largest value of the fp32 vector x (the first one among equals; the first NaN if there is one: what
// torch.argmax returns).  A long vector is split over the cores, each part's first maximum found in it (the LM head
// just wrote each core's share of the logits to that core's cache, which one core reading them all would not use),
// then the first part holding the largest wins.
int64_t argmax_f32(torch::Tensor x) {
  TORCH_CHECK(x.dtype() == torch::kFloat32 && x.dim() == 1 && x.is_contiguous() && x.numel() > 0,
              "x: contiguous non-empty fp32 vector");
  const float* p = x.data_ptr<float>();
  const int64_t n = x.numel();
  const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), n / ARGMAX_PART));
  std::vector<float> m(parts);
  std::vector<int64_t> at(parts);
  std::vector<char> nan(parts);
  auto part = [&](int64_t j) {
    const int64_t lo = n * j / parts, hi = n * (j + 1) / parts;
    bool has_nan = false;
    at[j] = lo + argmax_part(p + lo, hi - lo, m[j], has_nan);
    nan[j] = has_nan;
  };
  if (parts == 1) part(0);
  else at::parallel_for(0, parts, 1, [&](int64_t j0, int64_t j1) { for (int64_t j = j0; j < j1; ++j) part(j); });
  for (int64_t j = 0; j < parts; ++j)
    if (nan[j])
      for (int64_t i = n * j / parts; i < n; ++i) if (std::isnan(p[i])) return i;
  int64_t best = 0;
  for (int64_t j = 1; j < parts; ++j) if (m[j] > m[best]) best = j;  // ties: the earlier part, the first index
  return at[best];
}

// A grammar's mask on logits [R, V] (fp32, in place): -inf at every id whose bit is clear in the row's int32 words
// bitmask [R, ceil(V / 32)] (bit b of word w: id 32 w + b, llguidance's layout).  A word of all ids allowed is
// skipped, one of none written whole: a pass over the bitmask, and over the logits only where ids are banned.
void bitmask_fill(torch::Tensor logits, torch::Tensor bitmask) {
  TORCH_CHECK(logits.dtype() == torch::kFloat32 && logits.dim() == 2 && logits.is_contiguous(),
              "logits: contiguous fp32 [R, V]");
  TORCH_CHECK(bitmask.dtype() == torch::kInt32 && bitmask.dim() == 2 && bitmask.is_contiguous(),
              "bitmask: contiguous int32 [R, W]");
  const int64_t R = logits.size(0), V = logits.size(1), W = bitmask.size(1);
  TORCH_CHECK(bitmask.size(0) == R && W * 32 >= V, "bitmask: [R, ceil(V / 32)]");
  float* lp = logits.data_ptr<float>();
  const uint32_t* bp = reinterpret_cast<const uint32_t*>(bitmask.data_ptr<int32_t>());
  for (int64_t r = 0; r < R; ++r) {
    float* row = lp + r * V;
    const uint32_t* bits = bp + r * W;
    for (int64_t w = 0; w < W; ++w) {
      const uint32_t m = bits[w];
      if (m == 0xFFFFFFFFu) continue;
      const int64_t base = w * 32, end = std::min<int64_t>(base + 32, V);
      for (int64_t i = base; i < end; ++i)
        if (!((m >> (i - base)) & 1u)) row[i] = -INFINITY;
    }
  }
}
