"""Kernels: ``cpu_linear`` (bf16 weights on AVX2 CPUs, compiled on first use) and ``gather_matmul`` (Triton,
GPU or ``TRITON_INTERPRET=1``; optional)."""
