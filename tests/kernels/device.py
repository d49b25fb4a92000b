"""Where the kernel tests run: on CUDA tensors when Triton runs natively and a GPU is there (a
GPU host, ``TRITON_INTERPRET=0``), on the CPU under Triton's interpreter (CI)."""

from __future__ import annotations

import torch

from tests.kernels.grid import INTERPRETED

DEVICE = "cuda" if not INTERPRETED and torch.cuda.is_available() else "cpu"
TRITON_OK = INTERPRETED or torch.cuda.is_available()  # Triton runs: interpreted, or natively on CUDA
