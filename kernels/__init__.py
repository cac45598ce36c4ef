"""Triton kernels, one per file, each beside its torch reference."""
