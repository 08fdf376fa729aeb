"""Optional device kernels (Triton).  Nothing here is needed on a CPU."""
