"""Triton kernels shared by every Triton backend, each beside its launch contract.

``swa_metadata.py`` (the build), ``slot_rows.py`` (token-slot rows), ``request_window.py`` (request-window
layouts) and ``ragged.py`` (the ragged form) import triton; their launch modules (``rows_launch.py``,
``slot_rows_launch.py``, ``request_window_launch.py``, ``ragged_launch.py``, built on ``launch.py``) and ``tiles.py`` do not, so compile keys and argument records are importable
without it.
"""
