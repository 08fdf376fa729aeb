// The dense-weight product of cpu_linear: y = x W^T (+ b), bf16 weights widened to fp32 in registers (or fp32
// weights as they are), fp32 sums in a fixed order (the register tile of common.h), outputs rounded to bf16 or kept
// in fp32.
#include "common.h"
#include "linear_bf16.h"

namespace {
// x: [M, K] fp32, wp: [N, K] weight rows of E (uint16_t: bf16; float), bp: [N] fp32 or null; out: [M, N].
template <typename E>
void product(const float* xp, const E* wp, const float* bp, void* op, int64_t M, int64_t K, int64_t N, bool out_bf16) {
  const bool has_bias = bp != nullptr;
  constexpr int NT = 4;
  // Blocking: each thread takes a range of 4-row weight tiles; it walks them in sub-chunks of ~128 KiB of weights
  // (kept in L2) and, inside a sub-chunk, the input rows in blocks of MB (kept in L1/L2), 2 rows x 4 weight rows
  // per register tile.  One row: the weights stream once.  Many rows (a prefill): each weight sub-chunk is read
  // once from memory for all of them.  The order of every dot product is the same in all cases.
  constexpr int64_t MB = 16;
  const int64_t sub_tiles = std::max<int64_t>(1, (int64_t(128) * 1024 / (K * int64_t(sizeof(E)))) / NT);
  const int64_t grain = std::max<int64_t>(1, 64 / NT);
  at::parallel_for(0, (N + NT - 1) / NT, grain, [&](int64_t b0, int64_t b1) {
    float buf[2 * NT];
    for (int64_t s0 = b0; s0 < b1; s0 += sub_tiles) {
      const int64_t s1 = std::min(b1, s0 + sub_tiles);
      for (int64_t mb = 0; mb < M; mb += MB) {
        const int64_t me = std::min(M, mb + MB);
        for (int64_t b = s0; b < s1; ++b) {
          const int64_t n0 = b * NT;
          const int64_t nt = std::min<int64_t>(NT, N - n0);
          for (int64_t m0 = mb; m0 < me; m0 += 2) {
            const int64_t mt = std::min<int64_t>(2, me - m0);
            if (nt == NT) {
              if (mt == 2) tile<2, NT>(xp, K, wp + n0 * K, m0, buf);
              else tile<1, NT>(xp, K, wp + n0 * K, m0, buf);
            } else {
              for (int64_t j = 0; j < nt; ++j) {
                float one[2];
                if (mt == 2) tile<2, 1>(xp, K, wp + (n0 + j) * K, m0, one);
                else tile<1, 1>(xp, K, wp + (n0 + j) * K, m0, one);
                for (int64_t i = 0; i < mt; ++i) buf[i * NT + j] = one[i];
              }
            }
            for (int64_t i = 0; i < mt; ++i)
              for (int64_t j = 0; j < nt; ++j) {
                float v = buf[i * NT + j] + (has_bias ? bp[n0 + j] : 0.0f);
                const int64_t at = (m0 + i) * N + n0 + j;
                if (out_bf16) static_cast<uint16_t*>(op)[at] = f32_to_bf16(v);
                else static_cast<float*>(op)[at] = v;
              }
          }
        }
      }
    }
  });
}
}  // namespace

// x: [M, K] fp32 (contiguous), w: [N, K] bf16 or fp32, bias: [N] fp32 or empty.  Returns [M, N] in out_dtype.
torch::Tensor linear_bf16(torch::Tensor x, torch::Tensor w, torch::Tensor bias, bool out_bf16) {
  TORCH_CHECK(x.dtype() == torch::kFloat32 && x.is_contiguous() && x.dim() == 2, "x: contiguous fp32 [M, K]");
  TORCH_CHECK((w.dtype() == torch::kBFloat16 || w.dtype() == torch::kFloat32) && w.is_contiguous() && w.dim() == 2,
              "w: contiguous bf16 or fp32 [N, K]");
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  TORCH_CHECK(w.size(1) == K, "x and w disagree on K");
  const bool has_bias = bias.defined() && bias.numel() > 0;
  if (has_bias) TORCH_CHECK(bias.dtype() == torch::kFloat32 && bias.numel() == N, "bias: fp32 [N]");
  auto out = torch::empty({M, N}, x.options().dtype(out_bf16 ? torch::kBFloat16 : torch::kFloat32));
  const float* bp = has_bias ? bias.data_ptr<float>() : nullptr;
  if (w.dtype() == torch::kFloat32)
    product(x.data_ptr<float>(), w.data_ptr<float>(), bp, out.data_ptr(), M, K, N, out_bf16);
  else
    product(x.data_ptr<float>(), reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>()), bp, out.data_ptr(),
            M, K, N, out_bf16);
  return out;
}
