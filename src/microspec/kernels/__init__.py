"""Kernels: ``cpu_linear`` (bf16 weights) and ``cpu_quant`` (packed GGUF weights) on AVX2 CPUs, C++ in ``csrc/``
compiled on first use (``_build``); in Triton (optional; ``triton_env``: compiled on a GPU, interpreted on a CPU
under ``TRITON_INTERPRET=1``): ``gather_matmul`` (the indexed head's fused gather), ``window_update`` (MicroSpec's
device window update and row gather), ``rms_norm`` and ``rope`` (a whole RMSNorm, a layer's rotary embedding of the
queries or keys, in one launch: every norm and rotation of a model on a GPU)."""
