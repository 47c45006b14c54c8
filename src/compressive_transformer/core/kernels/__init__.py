"""Fused kernels for the attention (optional: the Triton kernels need the ``[triton]`` extra)."""
