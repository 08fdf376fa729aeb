// The integer path's activation rows and the interleaved forms' products, shared by quant_linear.cpp (which
// quantizes the rows and serves the file's block formats) and linear_x8.cpp (the interleaved forms).
#pragma once

#include <cstdint>
#include <vector>

#include "plan.h"

namespace {
// Quantized activation rows: int8 q [M, K], scales d and d * sum(q) [M, G], and for an offset type the per-lane
// sums of OFF * q [M, G, 8] (int32).
struct Act { const int8_t* q; const float* d; const float* ds; const int32_t* off; int64_t K, G; };
}  // namespace

namespace microspec {
// One interleaved form's product in linear_x8_many: type (1000 + the GGML type), data (`tiles` rows of RB bytes) and
// its output [M, tiles * 8]
struct X8Job { int64_t type; const uint8_t* w; int64_t tiles, RB; float* out; };
// out [M, tiles * 8] = the M quantized rows (qx [M, K], dx and dxs [M, K / 32]) times the interleaved form
// wp (type 1000 + the GGML type; `tiles` rows of RB bytes), transposed
void linear_x8(int64_t type, const int8_t* qx, const float* dx, const float* dxs, int64_t M, int64_t K,
               const uint8_t* wp, int64_t tiles, int64_t RB, float* op, const Plan& plan);
// The jobs' products of the same quantized rows, in one parallel region (see linear_x8.cpp)
void linear_x8_many(const std::vector<X8Job>& jobs, const int8_t* qx, const float* dx, const float* dxs, int64_t M,
                    int64_t K, const Plan& plan);
}  // namespace microspec
