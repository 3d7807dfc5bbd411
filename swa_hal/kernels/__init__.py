"""Triton kernels shared by every Triton backend. Importing this package imports triton."""
