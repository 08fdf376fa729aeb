// The function of the cpu_linear extension (bindings_linear.cpp exports it under this name).
#pragma once

#include <torch/types.h>

// plan: a call's choices (plan.h), as KernelPlan packs them (here: whether bf16 products take AMX tiles)
torch::Tensor linear_bf16(torch::Tensor x, torch::Tensor w, torch::Tensor bias, bool out_bf16, bool x_bf16,
                          int64_t plan);
