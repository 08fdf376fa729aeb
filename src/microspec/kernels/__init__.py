"""Kernels: ``cpu_linear`` (bf16 weights) and ``cpu_quant`` (packed GGUF weights) on AVX2 CPUs, C++ in ``csrc/``
compiled on first use (``_build``), and ``gather_matmul`` (Triton, GPU or ``TRITON_INTERPRET=1``; optional)."""
