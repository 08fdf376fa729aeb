// The Python module of the cpu_quant extension (the name comes from the build: TORCH_EXTENSION_NAME), with the
// error handling torch's load_inline gave these functions (torch::wrap_pybind_function).  The products, the
// attention and the fused layer release the GIL while they run (wrap_pybind_function_no_gil): a server's HTTP
// thread answers, tokenizes and streams meanwhile instead of waiting for the decoding thread's next bytecode.
#include <torch/extension.h>

#include "quant.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("linear_q", torch::wrap_pybind_function_no_gil(linear_q), "linear_q");
  m.def("dequant_rows", torch::wrap_pybind_function_no_gil(dequant_rows), "dequant_rows");
  m.def("argmax_f32", torch::wrap_pybind_function(argmax_f32), "argmax_f32");
  m.def("bitmask_fill", torch::wrap_pybind_function_no_gil(bitmask_fill), "bitmask_fill");
  m.def("linear_q8", torch::wrap_pybind_function_no_gil(linear_q8), "linear_q8");
  m.def("linear_q8_many", torch::wrap_pybind_function_no_gil(linear_q8_many), "linear_q8_many");
  m.def("widest_int_path", torch::wrap_pybind_function(widest_int_path), "widest_int_path");
  m.def("amx_bf16_available", torch::wrap_pybind_function(amx_bf16_available), "amx_bf16_available");
  m.def("repack_x8", torch::wrap_pybind_function_no_gil(repack_x8), "repack_x8");
  m.def("x8_gather", torch::wrap_pybind_function_no_gil(x8_gather), "x8_gather");
  m.def("rms_norm", torch::wrap_pybind_function(rms_norm), "rms_norm");
  m.def("rms_norm_bf16", torch::wrap_pybind_function(rms_norm_bf16), "rms_norm_bf16");
  m.def("rope", torch::wrap_pybind_function(rope), "rope");
  m.def("attend_rows", torch::wrap_pybind_function_no_gil(attend_rows), "attend_rows");
  m.def("attend_rows_many", torch::wrap_pybind_function_no_gil(attend_rows_many), "attend_rows_many");
  m.def("attention_wide_available", torch::wrap_pybind_function(attention_wide_available),
        "attention_wide_available");
  m.def("layer_step", torch::wrap_pybind_function_no_gil(layer_step), "layer_step");
  // module_local: two builds of this extension in one process (benchmarks/measure/kernel_ab.py) each keep their own
  pybind11::class_<LayersPlan, std::shared_ptr<LayersPlan>>(m, "LayersPlan", pybind11::module_local())
      .def(pybind11::init<std::vector<torch::Tensor>, std::vector<int64_t>, std::vector<torch::Tensor>,
                          std::vector<torch::Tensor>, std::vector<int64_t>, std::vector<int64_t>,
                          std::vector<int64_t>, double, double>());
  m.def("layers_step", torch::wrap_pybind_function_no_gil(layers_step), "layers_step");
}
