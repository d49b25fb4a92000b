"""Does running the LoRA shrink beside the base GEMM (a second stream in the graph) pay?

    python -m multilora_studio.kernels.overlap_bench [--layers 32] [--batch 32] [--rank 16]

A decode step's projections at the Llama-3-8B shape (q/k/v, o, gate/up, down per layer,
bf16, random weights), batch 32 with every row on its own adapter, captured in CUDA graphs
three ways and replayed: base GEMMs only; GEMM then shrink then expand on one stream (what
the engine does); and the shrink forked onto a second stream so that it runs while the base
GEMM reads the same activations, joined before the expand. Prints the median replay times
(``triton.testing.do_bench``) and checks that both LoRA variants give the same outputs. CUDA only.
"""

from __future__ import annotations

import argparse

import torch

from . import lora_triton
from .bench import bench_ms
from .lora import build_lora_batch

# name: (in_features, output slice widths) at the Llama-3-8B shape
SHAPES = {
    "qkv": (4096, (4096, 1024, 1024)),
    "o": (4096, (4096,)),
    "gate_up": (4096, (14336, 14336)),
    "down": (14336, (4096,)),
}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rank", type=int, default=16)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("CUDA only")
    torch.manual_seed(0)
    dev, dt, t, r = torch.device("cuda"), torch.bfloat16, args.batch, args.rank
    slots = t  # every row on its own adapter
    batch = build_lora_batch(
        torch.arange(t, dtype=torch.int32, device=dev),
        torch.full((slots,), r, dtype=torch.int32, device=dev),
        slots,
    )
    layers = []
    for _ in range(args.layers):
        layer = {}
        for name, (k, widths) in SHAPES.items():
            n = sum(widths)
            offsets = (0, *torch.tensor(widths).cumsum(0).tolist())
            layer[name] = (
                torch.randn(n, k, device=dev, dtype=dt) * k**-0.5,  # W [N, K]
                torch.randn(slots, len(widths), r, k, device=dev, dtype=dt) * k**-0.5,  # A [L, S, R, K]
                torch.randn(slots, n, r, device=dev, dtype=dt) * 0.1,  # B [L, N, R]
                offsets,
                torch.randn(t, k, device=dev, dtype=dt),  # x [T, K]
                torch.empty(t, n, device=dev, dtype=dt),  # y [T, N]
            )
        layers.append(layer)
    side = torch.cuda.Stream()

    def step(mode: str) -> None:
        main_stream = torch.cuda.current_stream()
        for layer in layers:
            for w, a, b, offsets, x, y in layer.values():
                if mode == "overlap":
                    side.wait_stream(main_stream)
                    with torch.cuda.stream(side):
                        part = lora_triton.shrink_partials(x, a, batch)  # [splits, S, T, R]
                    torch.matmul(x, w.T, out=y)
                    main_stream.wait_stream(side)
                    lora_triton.expand(y, part, b, batch, offsets)
                else:
                    torch.matmul(x, w.T, out=y)
                    if mode == "serial":
                        part = lora_triton.shrink_partials(x, a, batch)
                        lora_triton.expand(y, part, b, batch, offsets)

    graphs, outputs = {}, {}
    pool = torch.cuda.graph_pool_handle()
    for mode in ("base", "serial", "overlap"):
        step(mode)  # compile outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            step(mode)
        graphs[mode] = graph
        graph.replay()
        torch.cuda.synchronize()
        outputs[mode] = [y.clone() for layer in layers for *_, y in layer.values()]
    same = all(torch.equal(p, q) for p, q in zip(outputs["serial"], outputs["overlap"], strict=True))
    times = {mode: bench_ms(graph.replay) for mode, graph in graphs.items()}
    base = times["base"]
    print(f"{args.layers} layers, batch {t}, {slots} distinct rank-{r} adapters, bf16, CUDA graphs")
    for mode, ms in times.items():
        extra = "" if mode == "base" else f"  (LoRA +{ms - base:.3f} ms, base / this = {base / ms:.3f})"
        print(f"  {mode:<8} {ms:7.3f} ms{extra}")
    print(f"  serial and overlap outputs identical: {same}")


if __name__ == "__main__":
    main()
