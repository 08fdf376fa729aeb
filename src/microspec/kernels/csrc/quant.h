// The functions of the cpu_quant extension (bindings_quant.cpp exports them under these names).
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "plan.h"

// dequant.cpp
torch::Tensor dequant_rows(torch::Tensor w, int64_t type, int64_t K, torch::Tensor ids);
// quant_linear.cpp
torch::Tensor linear_q(torch::Tensor x, torch::Tensor w, int64_t type, int64_t K);
// plan: a call's choices (plan.h), as KernelPlan packs them; the products, the attention and the layers take it
torch::Tensor linear_q8(torch::Tensor x, torch::Tensor w, int64_t type, int64_t K, int64_t plan);
std::vector<torch::Tensor> linear_q8_many(torch::Tensor x, std::vector<torch::Tensor> ws, std::vector<int64_t> types,
                                          int64_t K, int64_t plan);
// linear_x8.cpp: the widest path of the interleaved integer products this CPU has (0 AVX2, 1 AVX-512 VNNI on
// 256-bit registers, 2 on 512-bit registers, 3 AMX)
int64_t widest_int_path();
// linear_x8.cpp: whether this CPU has AMX-BF16 tiles this process may use (for cpu_linear's bf16 products)
bool amx_bf16_available();
// repack.cpp
torch::Tensor repack_x8(torch::Tensor w, int64_t type);
torch::Tensor x8_gather(torch::Tensor w, int64_t type, int64_t K, torch::Tensor ids);
// row_ops.cpp
torch::Tensor rms_norm(torch::Tensor x, torch::Tensor w, double eps);
torch::Tensor rms_norm_bf16(torch::Tensor x, torch::Tensor w, double eps, bool gemma);
torch::Tensor rope(torch::Tensor x, torch::Tensor cos, torch::Tensor sin);
int64_t argmax_f32(torch::Tensor x);
void bitmask_fill(torch::Tensor logits, torch::Tensor bitmask);
// attention.cpp
torch::Tensor attend_rows(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor allowed, double scale,
                          int64_t plan);
// attention.cpp: whether this CPU has the attention's 512-bit form (AVX-512 F and DQ; the same values as the 256-bit)
bool attention_wide_available();
// One query row [H, D] (contiguous) over its sequence's fp32 keys and values [G, S, D] (strides ks0, ks1 / vs0, vs1;
// unit along D), the visible ones where allowed[s] (nullptr: all), into out [H, D]
struct RowAttention {
  const float *q, *k, *v;
  const bool* allowed;
  float* out;
  int64_t S, ks0, ks1, vs0, vs1;
};
// attend_rows_many's pass over rows given as pointers (H heads of D over G key groups): the same values
void attend_row_ptrs(const std::vector<RowAttention>& rows, int64_t H, int64_t D, int64_t G, double scale);
std::vector<torch::Tensor> attend_rows_many(std::vector<torch::Tensor> qs, std::vector<torch::Tensor> ks,
                                            std::vector<torch::Tensor> vs, std::vector<torch::Tensor> alloweds,
                                            double scale);
// layer_step.cpp
torch::Tensor layer_step(torch::Tensor x, std::vector<torch::Tensor> mats, std::vector<int64_t> meta,
                         std::vector<torch::Tensor> biases, std::vector<torch::Tensor> norms, torch::Tensor cos,
                         torch::Tensor sin, std::vector<torch::Tensor> kvs, std::vector<int64_t> rows,
                         std::vector<int64_t> starts, std::vector<int64_t> los, std::vector<torch::Tensor> alloweds,
                         std::vector<int64_t> dims, double eps, double scale, int64_t plan);
// A packed model's layers as layers_step runs them: layer_step's per-layer arguments, kept once (not some twenty
// tensors a layer converted from Python at every step), with the sliding window kind and the RoPE base each layer
// takes
struct LayersPlan {
  std::vector<torch::Tensor> mats, biases, norms;  // 7, 7 and 6 a layer, in layer_step's order
  std::vector<int64_t> meta, windows, ropes, dims;  // 21 a layer; one a layer each; layer_step's 5
  double eps, scale;
  LayersPlan(std::vector<torch::Tensor> mats, std::vector<int64_t> meta, std::vector<torch::Tensor> biases,
             std::vector<torch::Tensor> norms, std::vector<int64_t> dims, std::vector<int64_t> windows,
             std::vector<int64_t> ropes, double eps, double scale);
};
torch::Tensor layers_step(torch::Tensor x, const std::shared_ptr<LayersPlan>& plan, int64_t layers,
                          std::vector<torch::Tensor> cos, std::vector<torch::Tensor> sin,
                          std::vector<torch::Tensor> kvs, std::vector<int64_t> rows, std::vector<int64_t> starts,
                          std::vector<int64_t> los, std::vector<torch::Tensor> alloweds, int64_t kernels);
