// ---------------------------------------------------------------------------------------------------------------
// One decoder layer of a packed GGUF model on fp32 rows: the operations of NativeCausalLM.layer, in its order,
// through the same kernels and torch operations — the same values, without a Python dispatch per operation (on a
// 2-core CPU that dispatch cost a small model's decode step as much as its products).
#include "common.h"
#include "quant.h"

namespace {

torch::Tensor with_bias(torch::Tensor y, const torch::Tensor& bias) {
  return bias.defined() && bias.numel() ? y + bias : y;
}

torch::Tensor lin(const torch::Tensor& x, const torch::Tensor& w, int64_t type, int64_t K, int64_t integer,
                  const torch::Tensor& bias, int64_t plan) {
  return with_bias(integer ? linear_q8(x, w, type, K, plan) : linear_q(x, w, type, K), bias);
}

// The products of matrices `idx` with the same input: on the integer path with one K, through linear_q8_many (one
// quantization of the input, one parallel region; the same values as one product each), else one lin each
std::vector<torch::Tensor> lins(const torch::Tensor& x, const std::vector<torch::Tensor>& mats,
                                const std::vector<int64_t>& meta, const std::vector<torch::Tensor>& biases,
                                std::initializer_list<int> idx, int64_t plan) {
  const int64_t K = meta[3 * *idx.begin() + 1];
  bool joint = x.is_contiguous() && x.dim() == 2;
  for (int i : idx) joint = joint && meta[3 * i + 2] && meta[3 * i + 1] == K;
  std::vector<torch::Tensor> out;
  if (!joint) {
    for (int i : idx) out.push_back(lin(x, mats[i], meta[3 * i], meta[3 * i + 1], meta[3 * i + 2], biases[i], plan));
    return out;
  }
  std::vector<torch::Tensor> ws;
  std::vector<int64_t> types;
  for (int i : idx) { ws.push_back(mats[i]); types.push_back(meta[3 * i]); }
  out = linear_q8_many(x, ws, types, K, plan);
  size_t j = 0;
  for (int i : idx) { out[j] = with_bias(out[j], biases[i]); ++j; }
  return out;
}

// rows t of the fp32 src (H heads of hd; strides s0 a head, s1 a row) from r0 into dst (strides d0, d1) from slot
// start, each row of hd contiguous
void copy_rows(float* dp, int64_t d0, int64_t d1, const float* sp, int64_t s0, int64_t s1, int64_t H, int64_t hd,
               int64_t r0, int64_t start, int64_t t) {
  for (int64_t h = 0; h < H; ++h)
    for (int64_t r = 0; r < t; ++r)
      std::memcpy(dp + h * d0 + (start + r) * d1, sp + h * s0 + (r0 + r) * s1, hd * sizeof(float));
}

// rows t of src [H, T, hd] from r0 into dst [H, capacity, hd] (a layer's keys or values) from slot start: as
// dst.narrow(1, start, t).copy_(src.narrow(1, r0, t)), without the views' dispatch where both are fp32
void put_rows(const torch::Tensor& dst, const torch::Tensor& src, int64_t r0, int64_t start, int64_t t) {
  if (dst.scalar_type() != torch::kFloat32 || src.scalar_type() != torch::kFloat32 || dst.stride(2) != 1 ||
      src.stride(2) != 1) {
    dst.narrow(1, start, t).copy_(src.narrow(1, r0, t));
    return;
  }
  copy_rows(dst.data_ptr<float>(), dst.stride(0), dst.stride(1), src.data_ptr<float>(), src.stride(0),
            src.stride(1), src.size(0), src.size(2), r0, start, t);
}

// A segment's one-row decode step on fp32 rows and cache, as pointers (no tensor views: some ten a segment and
// layer are a measurable share of a batch's decode step on a small CPU): its keys and
// values go into the cache, and its query row's attention over its own keys is returned (attend_row_ptrs takes the
// batch's rows in one pass).  c: the sequence's cache of this layer [2, G, capacity, hd] (layer < 0) or its whole
// cache [layers, 2, G, capacity, hd]; k, v: [G, T, hd] views of the new keys and values, q [H, T, hd] (a head's
// row contiguous); the row is r0.  Whether it applies: decode_row_ok.
bool decode_row_ok(const torch::Tensor& c, int64_t layer, const torch::Tensor& q, const torch::Tensor& k,
                   const torch::Tensor& v, const torch::Tensor& allowed, int64_t start, int64_t lo) {
  const int64_t o = layer < 0 ? 0 : 1;
  return c.scalar_type() == torch::kFloat32 && c.dim() == 4 + o && c.stride(3 + o) == 1 &&
         (layer < 0 || layer < c.size(0)) && c.size(o) == 2 && c.size(o + 1) == k.size(0) &&
         c.size(o + 3) == k.size(2) && start >= 0 && start < c.size(o + 2) && lo >= 0 && lo <= start &&
         q.scalar_type() == torch::kFloat32 && k.scalar_type() == torch::kFloat32 &&
         v.scalar_type() == torch::kFloat32 && q.stride(2) == 1 && q.stride(0) == q.size(2) && k.stride(2) == 1 &&
         v.stride(2) == 1 &&
         (!allowed.defined() || allowed.numel() == 0 ||
          (allowed.scalar_type() == torch::kBool && allowed.is_contiguous() && allowed.numel() == start + 1 - lo));
}

RowAttention decode_row(const torch::Tensor& c, int64_t layer, const torch::Tensor& q, const torch::Tensor& k,
                        const torch::Tensor& v, const torch::Tensor& allowed, int64_t r0, int64_t start, int64_t lo,
                        float* out) {
  const int64_t o = layer < 0 ? 0 : 1, G = k.size(0), hd = k.size(2);
  float* kc = c.data_ptr<float>() + (layer < 0 ? 0 : layer * c.stride(0));
  float* vc = kc + c.stride(o);
  const int64_t sg = c.stride(o + 1), ss = c.stride(o + 2);
  copy_rows(kc, sg, ss, k.data_ptr<float>(), k.stride(0), k.stride(1), G, hd, r0, start, 1);
  copy_rows(vc, sg, ss, v.data_ptr<float>(), v.stride(0), v.stride(1), G, hd, r0, start, 1);
  const bool mask = allowed.defined() && allowed.numel() > 0;
  return RowAttention{q.data_ptr<float>() + r0 * q.stride(1), kc + lo * ss, vc + lo * ss,
                      mask ? allowed.data_ptr<bool>() : nullptr, out, start + 1 - lo, sg, ss, sg, ss};
}

// layer_step's work; kvs[j]: segment j's cache of this layer [2, G, capacity, hd] (layer < 0), or its whole cache
// [layers, 2, G, capacity, hd] of which this is layer `layer` (layers_step: no view a layer)
torch::Tensor layer_impl(torch::Tensor x, const std::vector<torch::Tensor>& mats, const std::vector<int64_t>& meta,
                         const std::vector<torch::Tensor>& biases, const std::vector<torch::Tensor>& norms,
                         const torch::Tensor& cos, const torch::Tensor& sin, const std::vector<torch::Tensor>& kvs,
                         int64_t layer, const std::vector<int64_t>& rows, const std::vector<int64_t>& starts,
                         const std::vector<int64_t>& los, const std::vector<torch::Tensor>& alloweds,
                         const std::vector<int64_t>& dims, double eps, double scale, int64_t plan) {
  const size_t nseg = kvs.size();
  const int64_t T = x.size(0), nh = dims[0], nkv = dims[1], hd = dims[2], act = dims[3];
  const bool gemma = dims[4] != 0;
  auto L = [&](int i, const torch::Tensor& in) {
    return lin(in, mats[i], meta[3 * i], meta[3 * i + 1], meta[3 * i + 2], biases[i], plan);
  };
  auto N = [&](int i, const torch::Tensor& in) { return rms_norm(in, norms[i], eps); };
  const torch::Tensor h = norms[0].numel() ? N(0, x) : x;
  std::vector<torch::Tensor> qkv = lins(h, mats, meta, biases, {0, 1, 2}, plan);
  torch::Tensor q = qkv[0].view({T, nh, hd});
  torch::Tensor k = qkv[1].view({T, nkv, hd});
  const torch::Tensor v = qkv[2].view({T, nkv, hd}).transpose(0, 1);
  if (norms[4].numel()) { q = N(4, q); k = N(5, k); }
  q = rope(q, cos, sin).transpose(0, 1);
  k = rope(k, cos, sin).transpose(0, 1);
  // attention per segment over its own cache: the one-row segments (decode steps, one sequence's or a batch's) whose
  // caches the pointers can take into o's rows in one pass (attend_row_ptrs: the same values as one call each), the
  // others through tensor views (one sequence of several rows: its output viewed as o's rows)
  std::vector<char> by_row(nseg);
  for (size_t j = 0; j < nseg; ++j)
    by_row[j] = rows[j] == 1 && decode_row_ok(kvs[j], layer, q, k, v, alloweds[j], starts[j], los[j]);
  const bool one_view = nseg == 1 && !by_row[0];
  torch::Tensor o = one_view ? torch::Tensor() : torch::empty({T, nh * hd}, q.options());
  std::vector<RowAttention> single;
  int64_t r0 = 0;
  for (size_t j = 0; j < nseg; ++j) {
    const int64_t t = rows[j], start = starts[j], lo = los[j], S = start + t;
    TORCH_CHECK(r0 + t <= T, "layer_step: the segments' rows do not add up to x's");
    if (by_row[j]) {
      single.push_back(decode_row(kvs[j], layer, q, k, v, alloweds[j], r0, start, lo,
                                  o.data_ptr<float>() + r0 * nh * hd));
    } else {
      const torch::Tensor kv = layer < 0 ? kvs[j] : kvs[j].select(0, layer);
      put_rows(kv.select(0, 0), k, r0, start, t);
      put_rows(kv.select(0, 1), v, r0, start, t);
      const torch::Tensor keys = kv.select(0, 0).narrow(1, lo, S - lo), values = kv.select(0, 1).narrow(1, lo, S - lo);
      const torch::Tensor out = attend_rows(q.narrow(1, r0, t), keys, values, alloweds[j], scale, plan).transpose(0, 1);
      if (one_view) o = out.reshape({T, nh * hd});
      else o.narrow(0, r0, t).view({t, nh, hd}).copy_(out);
    }
    r0 += t;
  }
  TORCH_CHECK(r0 == T, "layer_step: the segments' rows do not add up to x's");
  if (!single.empty()) attend_row_ptrs(single, nh, hd, nkv, scale);
  o = L(3, o);
  auto mlp = [&](const torch::Tensor& in) {
    std::vector<torch::Tensor> gu = lins(in, mats, meta, biases, {4, 5}, plan);
    torch::Tensor& g = gu[0];
    if (act == 0) at::silu_(g);
    else at::gelu_(g, act == 1 ? "tanh" : "none");
    return L(6, g.mul_(gu[1]));
  };
  if (gemma) {
    x = x + N(1, o);
    return x + N(3, mlp(N(2, x)));
  }
  x = x + o;
  return x + mlp(N(1, x));
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
                         std::vector<int64_t> dims, double eps, double scale, int64_t plan) {
  TORCH_CHECK(mats.size() == 7 && meta.size() == 21 && biases.size() == 7 && norms.size() == 6 && dims.size() == 5,
              "layer_step: 7 matrices, 21 meta values, 7 biases, 6 norms, 5 dims");
  const size_t nseg = kvs.size();
  TORCH_CHECK(nseg > 0 && rows.size() == nseg && starts.size() == nseg && los.size() == nseg &&
              alloweds.size() == nseg, "layer_step: one cache, row count, start, first key and mask per segment");
  return layer_impl(x, mats, meta, biases, norms, cos, sin, kvs, -1, rows, starts, los, alloweds, dims, eps, scale,
                    plan);
}

LayersPlan::LayersPlan(std::vector<torch::Tensor> mats_, std::vector<int64_t> meta_,
                       std::vector<torch::Tensor> biases_, std::vector<torch::Tensor> norms_,
                       std::vector<int64_t> dims_, std::vector<int64_t> windows_, std::vector<int64_t> ropes_,
                       double eps_, double scale_)
    : mats(std::move(mats_)), biases(std::move(biases_)), norms(std::move(norms_)), meta(std::move(meta_)),
      windows(std::move(windows_)), ropes(std::move(ropes_)), dims(std::move(dims_)), eps(eps_), scale(scale_) {
  const size_t L = windows.size();
  TORCH_CHECK(L > 0 && ropes.size() == L && mats.size() == 7 * L && meta.size() == 21 * L &&
              biases.size() == 7 * L && norms.size() == 6 * L && dims.size() == 5,
              "LayersPlan: per layer 7 matrices, 21 meta values, 7 biases, 6 norms, a window and a RoPE base; 5 dims");
}

// The first `layers` layers of `plan` over x, each as layer_step: the same calls, so the same values as one call a
// layer.  Segment j (rows[j] rows of x from its sequence's starts[j]) has kvs[j], its sequence's whole cache
// [layers, 2, G, capacity, hd]; per window kind w its first visible key los[j * W + w] and mask alloweds[j * W + w]
// (W kinds: the plan's window indices); cos[r], sin[r] are RoPE base r's rows.
torch::Tensor layers_step(torch::Tensor x, const std::shared_ptr<LayersPlan>& plan, int64_t layers,
                          std::vector<torch::Tensor> cos, std::vector<torch::Tensor> sin,
                          std::vector<torch::Tensor> kvs, std::vector<int64_t> rows, std::vector<int64_t> starts,
                          std::vector<int64_t> los, std::vector<torch::Tensor> alloweds, int64_t kernels) {
  TORCH_CHECK(plan, "layers_step: no plan");
  const LayersPlan& p = *plan;
  const size_t nseg = kvs.size();
  TORCH_CHECK(layers >= 0 && size_t(layers) <= p.windows.size(), "layers_step: more layers than the plan has");
  TORCH_CHECK(nseg > 0 && rows.size() == nseg && starts.size() == nseg && los.size() % nseg == 0 &&
              alloweds.size() == los.size() && cos.size() == sin.size(),
              "layers_step: per segment a cache, a row count, a start, and a first key and mask per window kind");
  const size_t W = los.size() / nseg;
  std::vector<torch::Tensor> allowed(nseg);
  std::vector<int64_t> lo(nseg);
  for (int64_t i = 0; i < layers; ++i) {
    const size_t w = size_t(p.windows[i]), r = size_t(p.ropes[i]);
    TORCH_CHECK(w < W && r < cos.size(), "layers_step: a layer's window kind or RoPE base is not given");
    for (size_t j = 0; j < nseg; ++j) {
      lo[j] = los[j * W + w];
      allowed[j] = alloweds[j * W + w];
    }
    auto at = [&](const std::vector<torch::Tensor>& v, int n) {
      return std::vector<torch::Tensor>(v.begin() + n * i, v.begin() + n * (i + 1));
    };
    x = layer_impl(x, at(p.mats, 7), std::vector<int64_t>(p.meta.begin() + 21 * i, p.meta.begin() + 21 * (i + 1)),
                   at(p.biases, 7), at(p.norms, 6), cos[r], sin[r], kvs, i, rows, starts, lo, allowed, p.dims, p.eps,
                   p.scale, kernels);
  }
  return x;
}
