"""Thread-block programs: collectives (ring, NVLS), GEMM tiles, and their helpers."""
