// The function of the cpu_linear extension (bindings_linear.cpp exports it under this name).
#pragma once

#include <torch/types.h>

torch::Tensor linear_bf16(torch::Tensor x, torch::Tensor w, torch::Tensor bias, bool out_bf16);
