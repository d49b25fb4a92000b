"""Kernel tests run the Triton kernels on the CPU under Triton's interpreter.

TRITON_INTERPRET must be set before triton is imported (Triton reads it when a kernel is
defined). `setdefault` lets a GPU machine run the same tests natively with
TRITON_INTERPRET=0.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
