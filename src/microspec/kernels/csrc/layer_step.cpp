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
// The rows are segments of one or more sequences, each with its own cache: segment j is rows[j] consecutive rows of
// x, kvs[j] its sequence's [2, G, capacity, hd] cache of this layer, where its keys and values go at starts[j]; it
// sees keys los[j]..starts[j]+rows[j]-1 through alloweds[j] [rows[j], S'] (empty: all).  The products run once over
// all rows (one read of the packed weights); attention runs per segment over its own cache, so a row's result is the
// one it has alone (attention.cpp visits exactly its visible keys).
// dims: heads, kv heads, head dim, activation (0 silu, 1 gelu tanh, 2 gelu), gemma sandwich norms (0/1).
torch::Tensor layer_step(torch::Tensor x, std::vector<torch::Tensor> mats, std::vector<int64_t> meta,
                         std::vector<torch::Tensor> biases, std::vector<torch::Tensor> norms, torch::Tensor cos,
                         torch::Tensor sin, std::vector<torch::Tensor> kvs, std::vector<int64_t> rows,
                         std::vector<int64_t> starts, std::vector<int64_t> los, std::vector<torch::Tensor> alloweds,
                         std::vector<int64_t> dims, double eps, double scale) {
  TORCH_CHECK(mats.size() == 7 && meta.size() == 21 && biases.size() == 7 && norms.size() == 6 && dims.size() == 5,
              "layer_step: 7 matrices, 21 meta values, 7 biases, 6 norms, 5 dims");
  const size_t nseg = kvs.size();
  TORCH_CHECK(nseg > 0 && rows.size() == nseg && starts.size() == nseg && los.size() == nseg &&
              alloweds.size() == nseg, "layer_step: one cache, row count, start, first key and mask per segment");
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
  std::vector<torch::Tensor> outs;
  int64_t r0 = 0;
  for (size_t j = 0; j < nseg; ++j) {
    const int64_t t = rows[j], start = starts[j], lo = los[j], S = start + t;
    const torch::Tensor& kv = kvs[j];
    kv.select(0, 0).narrow(1, start, t).copy_(k.narrow(1, r0, t));
    kv.select(0, 1).narrow(1, start, t).copy_(v.narrow(1, r0, t));
    const torch::Tensor keys = kv.select(0, 0).narrow(1, lo, S - lo), values = kv.select(0, 1).narrow(1, lo, S - lo);
    outs.push_back(attend_rows(q.narrow(1, r0, t), keys, values, alloweds[j], scale));
    r0 += t;
  }
  TORCH_CHECK(r0 == T, "layer_step: the segments' rows do not add up to x's");
  torch::Tensor o = nseg == 1 ? outs[0] : torch::cat(outs, 1);
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
