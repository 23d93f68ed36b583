"""The Triton kernels of the GPU fast path. `attention/triton_backend.py` decides per step which of them run."""
