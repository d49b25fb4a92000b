"""Does a CPU GEMM give a row the same bits at every row count? (the reason for kernels/row_tiles.py)

    python -m benchmarks.kernels.gemm_row_invariance

For the embedded model's projection shapes, float32 and bfloat16, ``F.linear`` and the
oneDNN-packed GEMM: row 0 of ``linear(x[:M])`` against row 0 of ``linear(x[:1])`` for M from 1
to 300 (which M give other bits, and how many of the N outputs differ), and the same row moved
to every position of a fixed 8-row tile whose other rows change (``row_tiled``'s case).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from multilora_studio.kernels.cpu_linear import onednn_packing_available, pack_weight, packed_linear

SHAPES = {"qkv": (960, 576), "gate_up": (3072, 576), "down": (576, 1536), "lm_head": (49152, 576)}
ROW_COUNTS = (1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 64, 65, 128, 256, 300)
TILE = 8


def main() -> None:
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, tile {TILE}")
    for dtype in (torch.float32, torch.bfloat16):
        for shape_name, (n, k) in SHAPES.items():
            weight = torch.randn(n, k).to(dtype)
            x = torch.randn(ROW_COUNTS[-1], k).to(dtype)
            linears: dict[str, tuple[Callable[..., torch.Tensor], torch.Tensor]] = {
                "F.linear": (F.linear, weight)
            }
            if onednn_packing_available(dtype):
                linears["packed"] = (packed_linear, pack_weight(weight))
            for name, (linear, w) in linears.items():
                alone = linear(x[:1], w)[0]
                differing = [(m, int((linear(x[:m], w)[0] != alone).sum())) for m in ROW_COUNTS]
                differing = [(m, count) for m, count in differing if count]
                in_tile = linear(x[:TILE].contiguous(), w)[0]
                moved = max(
                    int((linear(torch.roll(x[:TILE], r, 0).contiguous(), w)[r] != in_tile).sum())
                    for r in range(TILE)
                )
                print(
                    f"{dtype!s:15} {shape_name:8} {name:9} M with other bits than M=1 (M: outputs of {n}): "
                    f"{differing or 'none'}; in a fixed {TILE}-row tile at any position: {moved} differ"
                )


if __name__ == "__main__":
    main()
