"""CuPy CUDA kernels implementing ``refops.kernels.KernelBackend`` (see docs/fastpath.md)."""
