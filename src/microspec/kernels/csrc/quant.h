// The functions of the cpu_quant extension (bindings_quant.cpp exports them under these names).
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <vector>

// dequant.cpp
torch::Tensor dequant_rows(torch::Tensor w, int64_t type, int64_t K, torch::Tensor ids);
// quant_linear.cpp
torch::Tensor linear_q(torch::Tensor x, torch::Tensor w, int64_t type, int64_t K);
torch::Tensor linear_q8(torch::Tensor x, torch::Tensor w, int64_t type, int64_t K);
std::vector<torch::Tensor> linear_q8_many(torch::Tensor x, std::vector<torch::Tensor> ws, std::vector<int64_t> types,
                                          int64_t K);
// linear_x8.cpp: the instruction path of the interleaved integer products (0 AVX2, 1 AVX-512 VNNI on 256-bit
// registers, 2 on 512-bit registers, 3 AMX; -1 the default, the widest the CPU has but AMX; a path the CPU lacks:
// AVX2);
// returns the one in use
int64_t set_int_path(int64_t path);
// linear_x8.cpp: from how many rows path 3 takes AMX tiles (< 1 only asks); returns it
int64_t set_amx_min_rows(int64_t rows);
int64_t set_amx_every_type(int64_t on);
// linear_x8.cpp: how many tiles ahead a product of up to 4 rows prefetches (0 none; -1 only asks); returns it
int64_t set_prefetch_tiles(int64_t tiles);
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
torch::Tensor attend_rows(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor allowed, double scale);
// attention.cpp: whether the attention takes its 512-bit form (1 where the CPU has it, 0 the 256-bit one; the same
// values; -1 only asks); returns the form in use
int64_t set_attention_wide(int64_t on);
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
                         std::vector<int64_t> dims, double eps, double scale);
// A packed model's layers as layers_step runs them: layer_step's per-layer arguments, kept once (converting some
// twenty tensors a layer from Python cost each decoder layer ~30 µs of a step on a 2-core CPU), with the sliding
// window kind and the RoPE base each layer takes
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
                          std::vector<int64_t> los, std::vector<torch::Tensor> alloweds);
