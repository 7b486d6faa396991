"""numba.cuda kernels, one module per algorithm; each module is a chapter to read."""
