// The Python module of the cpu_linear extension (the name comes from the build: TORCH_EXTENSION_NAME), with the
// error handling torch's load_inline gave these functions (torch::wrap_pybind_function).
#include <torch/extension.h>

#include "linear_bf16.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("linear_bf16", torch::wrap_pybind_function_no_gil(linear_bf16), "linear_bf16");
}
