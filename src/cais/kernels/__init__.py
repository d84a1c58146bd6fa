"""Thread-block programs: collectives (ring, NVLS), GEMM tiles, the GPU-local kernels
(row-wise dropout + residual + norm, attention, activations), and their helpers."""
