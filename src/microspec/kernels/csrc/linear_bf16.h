// The function of the cpu_linear extension (bindings_linear.cpp exports it under this name).
#pragma once

#include <torch/types.h>

torch::Tensor linear_bf16(torch::Tensor x, torch::Tensor w, torch::Tensor bias, bool out_bf16, bool x_bf16);
// Whether bf16 layers take AMX tiles (on: 1, off: 0, only ask: -1), capped by the CPU; returns the state
int64_t set_amx_bf16(int64_t on);
