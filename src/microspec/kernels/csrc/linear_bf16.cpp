// The dense-weight product of cpu_linear: y = x W^T (+ b), bf16 weights widened to fp32 in registers (or fp32
// weights as they are), fp32 sums in a fixed order (the register tile of common.h), outputs rounded to bf16 or kept
// in fp32.  Where the CPU has AMX-BF16 and the rows' values are bf16 (a bf16 model's activations), the weight rows
// in blocks of 16 of a bf16 matrix whose K is a multiple of 32 go through AMX tiles instead (amx_product): one
// sequence of tile products per weight row, the same whatever the number of rows, so batch-invariant too.
#include "amx.h"
#include "common.h"
#include "linear_bf16.h"
#include "plan.h"

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

// ---------------------------------------------------------------------------------------------------------------
// AMX-BF16.  A tile product C[16 weight rows][mt rows] += A · B, A the weight rows' 32 bf16 of a K step straight
// from W (16 rows of 64 bytes, the row stride 2K), B the activation rows' same 32 values as bf16 pairs (16 rows of
// mt x 4 bytes: row p holds each row's elements 2p, 2p + 1).  C stays in its tile over the whole of K (fp32,
// tdpbf16ps's own rounding), four weight-row tiles a pass (64 weight rows), then it is stored and transposed into
// the output.  Each output element is the same sequence of tile products, in K order, whatever mt or the block it
// falls in.
#define MICROSPEC_AMX_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,amx-tile,amx-bf16")))

// A call takes the tiles where its plan asks for them (plan.h) and amx_bf16_usable() (amx.h)

// tiles 0 (B: 16 rows of mt x 4 bytes), 1..3 (A: 16 rows of 64 bytes), 4..7 (C: 16 rows of mt fp32)
MICROSPEC_AMX_BF16 void amx_bf16_configure(int mt) {
  TileConfig c;
  for (int i = 0; i < 8; ++i) {
    c.colsb[i] = uint16_t(i >= 1 && i <= 3 ? 64 : 4 * mt);
    c.rows[i] = 16;
  }
  load_tile_config(c);
}

// The rows xp [M, K] fp32 (bf16 values) as B tiles: [M / 16 blocks][K / 2][16][2] bf16, the missing rows of the
// last block zero
std::vector<uint16_t> amx_bf16_rows(const float* xp, int64_t M, int64_t K) {
  const int64_t blocks = (M + 15) / 16;
  std::vector<uint16_t> xb(size_t(blocks * K * 16), 0);
  for (int64_t m = 0; m < M; ++m) {
    uint16_t* dst = xb.data() + (m / 16) * K * 16 + (m % 16) * 2;
    for (int64_t k = 0; k < K; ++k) dst[(k / 2) * 32 + (k % 2)] = f32_to_bf16(xp[m * K + k]);
  }
  return xb;
}

// Weight rows n0..n0+63 (four A tiles; `tiles` of them, 1..4) against row block mb (mt rows) of xb: C into cbuf
// [64][16] fp32
MICROSPEC_AMX_BF16 void amx_bf16_block(const uint16_t* wp, int64_t K, const uint16_t* xb, int64_t n0, int tiles,
                                       float* cbuf) {
  const int64_t stride = 2 * K;
  const uint8_t* w = reinterpret_cast<const uint8_t*>(wp + n0 * K);
  _tile_zero(4);
  _tile_zero(5);
  _tile_zero(6);
  _tile_zero(7);
  for (int64_t k0 = 0; k0 < K; k0 += 32) {
    _tile_loadd(0, xb + (k0 / 2) * 32, 64);
    const uint8_t* a = w + 2 * k0;
    _tile_loadd(1, a, stride);
    _tile_dpbf16ps(4, 1, 0);
    if (tiles > 1) {
      _tile_loadd(2, a + 16 * stride, stride);
      _tile_dpbf16ps(5, 2, 0);
    }
    if (tiles > 2) {
      _tile_loadd(3, a + 32 * stride, stride);
      _tile_dpbf16ps(6, 3, 0);
    }
    if (tiles > 3) {
      _tile_loadd(1, a + 48 * stride, stride);
      _tile_dpbf16ps(7, 1, 0);
    }
  }
  _tile_stored(4, cbuf, 64);
  if (tiles > 1) _tile_stored(5, cbuf + 16 * 16, 64);
  if (tiles > 2) _tile_stored(6, cbuf + 32 * 16, 64);
  if (tiles > 3) _tile_stored(7, cbuf + 48 * 16, 64);
}

MICROSPEC_AMX_BF16 void amx_bf16_release() { _tile_release(); }

// Weight rows 0..N16-1 (N16 a multiple of 16) of wp [N, K] bf16 against xp [M, K] (bf16 values; K a multiple of 32)
// on AMX tiles, into op [M, N]
void amx_product(const float* xp, const uint16_t* wp, const float* bp, void* op, int64_t M, int64_t K, int64_t N,
                 int64_t N16, bool out_bf16) {
  const std::vector<uint16_t> xb = amx_bf16_rows(xp, M, K);
  const int64_t blocks = (N16 + 63) / 64;  // of 64 weight rows (the last one may hold fewer tiles)
  at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    alignas(64) float cbuf[64 * 16];
    int configured = 0;
    for (int64_t mb = 0; mb < M; mb += 16) {
      const int mt = int(std::min<int64_t>(16, M - mb));
      if (mt != configured) {
        amx_bf16_configure(mt);
        configured = mt;
      }
      const uint16_t* x = xb.data() + (mb / 16) * K * 16;
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t n0 = b * 64;
        const int tiles = int(std::min<int64_t>(4, (N16 - n0) / 16));
        amx_bf16_block(wp, K, x, n0, tiles, cbuf);
        for (int64_t r = 0; r < 16 * tiles; ++r)
          for (int i = 0; i < mt; ++i) {
            const float v = cbuf[r * 16 + i] + (bp ? bp[n0 + r] : 0.0f);
            const int64_t at = (mb + i) * N + n0 + r;
            if (out_bf16) static_cast<uint16_t*>(op)[at] = f32_to_bf16(v);
            else static_cast<float*>(op)[at] = v;
          }
      }
    }
    if (configured) amx_bf16_release();
  });
}

}  // namespace

// x: [M, K] fp32 (contiguous), w: [N, K] bf16 or fp32, bias: [N] fp32 or empty.  Returns [M, N] in out_dtype.
// x_bf16: x's values are bf16 (a bf16 layer's activations): a bf16 w then takes AMX tiles where the plan asks for
// them, the CPU has them and K is a multiple of 32, for its weight rows in whole blocks of 16 (the rest as the others).
torch::Tensor linear_bf16(torch::Tensor x, torch::Tensor w, torch::Tensor bias, bool out_bf16, bool x_bf16,
                          int64_t plan) {
  TORCH_CHECK(x.dtype() == torch::kFloat32 && x.is_contiguous() && x.dim() == 2, "x: contiguous fp32 [M, K]");
  TORCH_CHECK((w.dtype() == torch::kBFloat16 || w.dtype() == torch::kFloat32) && w.is_contiguous() && w.dim() == 2,
              "w: contiguous bf16 or fp32 [N, K]");
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  TORCH_CHECK(w.size(1) == K, "x and w disagree on K");
  const bool has_bias = bias.defined() && bias.numel() > 0;
  if (has_bias) TORCH_CHECK(bias.dtype() == torch::kFloat32 && bias.numel() == N, "bias: fp32 [N]");
  auto out = torch::empty({M, N}, x.options().dtype(out_bf16 ? torch::kBFloat16 : torch::kFloat32));
  const float* bp = has_bias ? bias.data_ptr<float>() : nullptr;
  if (w.dtype() == torch::kFloat32) {
    product(x.data_ptr<float>(), w.data_ptr<float>(), bp, out.data_ptr(), M, K, N, out_bf16);
    return out;
  }
  const uint16_t* wp = reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>());
  const bool tiles = microspec::Plan::of(plan).amx_bf16 && amx_bf16_usable();
  const int64_t N16 = x_bf16 && K % 32 == 0 && M > 0 && tiles ? N / 16 * 16 : 0;
  if (N16 == 0) {
    product(x.data_ptr<float>(), wp, bp, out.data_ptr(), M, K, N, out_bf16);
    return out;
  }
  amx_product(x.data_ptr<float>(), wp, bp, out.data_ptr(), M, K, N, N16, out_bf16);
  if (N16 < N) {  // the rows after the whole blocks of 16, one product over [N16, N)
    torch::Tensor rest = torch::empty({M, N - N16}, out.options());
    product(x.data_ptr<float>(), wp + N16 * K, bp ? bp + N16 : nullptr, rest.data_ptr(), M, K, N - N16, out_bf16);
    out.narrow(1, N16, N - N16).copy_(rest);
  }
  return out;
}
