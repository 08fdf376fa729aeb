// ---------------------------------------------------------------------------------------------------------------
// One decoder layer of a packed GGUF model on fp32 rows: the operations of NativeCausalLM.layer, in its order,
// through the same kernels and torch operations — the same values, without a Python dispatch per operation (on a
// 2-core CPU that dispatch cost a small model's decode step as much as its products).
#include "common.h"
#include "quant.h"

namespace {

torch::Tensor lin(const torch::Tensor& x, const torch::Tensor& w, int64_t type, int64_t K, int64_t integer,
                  const torch::Tensor& bias) {
  torch::Tensor y = integer ? linear_q8(x, w, type, K) : linear_q(x, w, type, K);
  return bias.defined() && bias.numel() ? y + bias : y;
}

}  // namespace

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
