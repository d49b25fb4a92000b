"""What the LoRA term adds to a decode step's projections, for each way of running it.

    python -m benchmarks.kernels.step_lora_bench [--layers 32] [--batch 32] [--rank 16]
        [--slots 32] [--distinct 32 8 1] [--modes base serial shrink-in-gemm overlap shrink-in-gemm:8192:8]

A decode step's projections at the Llama-3-8B shape (per layer: q/k/v; o and residual-add +
RMSNorm; gate/up and SiLU-and-mul; down and residual-add + RMSNorm; bf16, random weights),
``--slots`` adapter slots of rank ``--rank``, the batch's rows spread over ``--distinct``
adapters, captured in one CUDA graph per mode and replayed:

* ``base``: the base GEMMs and the elementwise ops, no LoRA;
* ``serial``: GEMM, then the shrink, then the expand (the kernels the plan picks: token-major
  at decode sizes);
* ``overlap``: the shrink forked onto a second stream beside the GEMM, joined before the expand;
* ``shrink-in-gemm``: every slot's A rows appended to the base weight, so one GEMM gives the
  base output and the shrink against every slot; the expand reads each token's own slot
  (``lora_bgmv.expand_shrunk_in_gemm``). No shrink launch; reads every slot's A, in use or
  not. ``shrink-in-gemm:TILE:WARPS`` (or ``serial:...``) runs the expands with that tile and
  warp count; ``shrink-in-gemm-gemms`` is the extended GEMMs alone (no expand: the GEMMs'
  share of ``shrink-in-gemm``);
* ``engine``: ``shrink-in-gemm`` with the gate/up expand inside SiLU-and-mul (``lora_silu``)
  and the o and down expands inside residual-add + RMSNorm (``lora_norm``), as the engine runs
  a decode step.

Prints the median replay times (``triton.testing.do_bench``), what LoRA adds and at which
fraction of the copy bandwidth its bytes would need, and the largest difference of each
LoRA mode's outputs from ``serial`` relative to the LoRA term. CUDA only.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Any

import torch

from benchmarks.kernels.lora_bench import bench_ms
from multilora_studio.kernels import lora_bgmv, lora_sgmv
from multilora_studio.kernels.fused_ops import add_rms_norm, silu_and_mul
from multilora_studio.kernels.lora import LoRAPlan, add_rms_norm_lora, build_lora_batch, silu_and_mul_lora

# name: (in_features, output slice widths) at the Llama-3-8B shape
SHAPES = {
    "qkv": (4096, (4096, 1024, 1024)),
    "o": (4096, (4096,)),
    "gate_up": (4096, (14336, 14336)),
    "down": (14336, (4096,)),
}


def copy_bandwidth() -> float:
    """Device-to-device copy bandwidth in bytes/s (read + write) of a 1 GiB buffer."""
    src = torch.empty(1 << 29, dtype=torch.float16, device="cuda")
    dst = torch.empty_like(src)
    ms = bench_ms(lambda: dst.copy_(src))
    return 2 * src.numel() * 2 / (ms * 1e-3)


def make_layer(slots: int, rank: int, t: int) -> dict[str, dict[str, Any]]:
    dev, dt = torch.device("cuda"), torch.bfloat16
    layer = {}
    for name, (k, widths) in SHAPES.items():
        n, s = sum(widths), len(widths)
        w_ext = torch.randn(n + slots * s * rank, k, device=dev, dtype=dt) * k**-0.5  # [N + L*S*R, K]
        layer[name] = {
            "k": k,
            "n": n,
            "w": w_ext[:n],  # base weight [N, K], a view
            "w_ext": w_ext,
            "a": w_ext[n:].view(slots, s, rank, k),  # A [L, S, R, K], a view of the extra rows
            "b": torch.randn(slots, n, rank, device=dev, dtype=dt) * 0.1,  # B [L, N, R]
            "offsets": (0, *torch.tensor(widths).cumsum(0).tolist()),
            "x": torch.randn(t, k, device=dev, dtype=dt),  # [T, K]
            "out": torch.empty(t, n + slots * s * rank, device=dev, dtype=dt),  # [T, N + L*S*R]
            "res0": torch.randn(t, n, device=dev, dtype=dt),  # residual stream (o and down), [T, H]
            "norm": 1 + torch.randn(n, device=dev, dtype=dt) / 8,  # RMSNorm weight [H]
        }
        layer[name]["res"] = layer[name]["res0"].clone()
    return layer


def shrink(x: torch.Tensor, a: torch.Tensor, batch, plan: LoRAPlan) -> torch.Tensor:
    """The shrink's float32 partials [splits, S, T, R] from the kernels ``plan`` picks."""
    if plan.uses_bgmv(x.shape[0]):
        return lora_bgmv.shrink_partials(x, a, batch, plan)
    return lora_sgmv.shrink_partials(x, a, batch)


def expand(y: torch.Tensor, part: torch.Tensor, b: torch.Tensor, batch, offsets, plan: LoRAPlan) -> None:
    """The expand of ``part`` into ``y`` by the kernels ``plan`` picks."""
    if plan.uses_bgmv(y.shape[0]):
        lora_bgmv.expand(y, part, b, batch, offsets, plan)
    else:
        lora_sgmv.expand(y, part, b, batch, offsets)


def run_layer(
    layer: dict[str, dict],
    batch,
    mode: str,
    side: torch.cuda.Stream,
    slots: int,
    rank: int,
    counters,
    plan: LoRAPlan,
) -> list[torch.Tensor]:
    """One layer's projections in ``mode``; returns each group's output: gate/up's after
    SiLU-and-mul, o's and down's after residual-add + RMSNorm."""
    main_stream = torch.cuda.current_stream()
    results = []
    for name, p in layer.items():
        n, x, out = p["n"], p["x"], p["out"]
        y = out[:, :n]  # [T, N], row stride N + L*S*R
        if mode in ("shrink-in-gemm", "shrink-in-gemm-gemms", "engine"):
            torch.matmul(x, p["w_ext"].T, out=out)
            shrunk = out[:, n:].view(x.shape[0], slots, -1, rank)  # [T, L, S, R]
            if mode == "engine" and name == "gate_up":  # expand inside SiLU-and-mul
                results.append(silu_and_mul_lora(y, shrunk, p["b"], batch, plan))
                continue
            if mode == "engine" and name in ("o", "down"):  # expand inside residual-add + RMSNorm
                results.append(
                    add_rms_norm_lora(y, p["res"], p["norm"], 1e-5, shrunk, p["b"], batch, counters, plan)
                )
                continue
            if mode != "shrink-in-gemm-gemms":
                lora_bgmv.expand_shrunk_in_gemm(y, shrunk, p["b"], batch, p["offsets"], plan)
        elif mode == "overlap":
            side.wait_stream(main_stream)
            with torch.cuda.stream(side):
                part = shrink(x, p["a"], batch, plan)  # [splits, S, T, R]
            torch.matmul(x, p["w"].T, out=y)
            main_stream.wait_stream(side)
            expand(y, part, p["b"], batch, p["offsets"], plan)
        else:
            torch.matmul(x, p["w"].T, out=y)
            if mode == "serial":
                expand(y, shrink(x, p["a"], batch, plan), p["b"], batch, p["offsets"], plan)
        if name == "gate_up":
            results.append(silu_and_mul(y))
        elif name in ("o", "down"):
            results.append(add_rms_norm(y, p["res"], p["norm"], 1e-5))
        else:
            results.append(y)
    return results


def lora_bytes(distinct: int, t: int, rank: int) -> int:
    """Bytes the LoRA term needs per layer: adapters in use read once, x read, y read and written."""
    total = 0
    for k, widths in SHAPES.values():
        n = sum(widths)
        total += distinct * (len(widths) * rank * k + n * rank) * 2 + t * (k + 2 * n) * 2
    return total


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--slots", type=int, default=32)
    parser.add_argument("--distinct", type=int, nargs="+", default=[32, 8, 1])
    parser.add_argument("--modes", nargs="+", default=["base", "serial", "shrink-in-gemm", "engine"])
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("CUDA only")
    torch.manual_seed(0)
    t, r, slots = args.batch, args.rank, args.slots
    bw = copy_bandwidth()
    layers = [make_layer(slots, r, t) for _ in range(args.layers)]
    side = torch.cuda.Stream()
    counters = torch.zeros(t, dtype=torch.int32, device="cuda")  # add_rms_norm_lora's row counters
    shipped = LoRAPlan.for_device("cuda", torch.bfloat16)
    print(f"{args.layers} layers, batch {t}, {slots} slots of rank {r}, bf16, copy {bw / 1e12:.2f} TB/s")
    for distinct in args.distinct:
        token_slots = torch.arange(t, dtype=torch.int32, device="cuda") % distinct
        batch = build_lora_batch(
            token_slots, torch.full((slots,), r, dtype=torch.int32, device="cuda"), slots
        )
        graphs, outputs = {}, {}
        for mode in args.modes:
            kind, *tile = mode.split(":")
            plan = shipped
            if tile:  # the expands' tile and warp count
                plan = replace(shipped, bgmv_expand_tile=int(tile[0]), bgmv_expand_warps=int(tile[1]))
            for layer in layers:  # compile outside the capture
                run_layer(layer, batch, kind, side, slots, r, counters, plan)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                results = [
                    o
                    for layer in layers
                    for o in run_layer(layer, batch, kind, side, slots, r, counters, plan)
                ]
            graphs[mode] = graph
            for layer in layers:  # the same residual stream for every mode's compared replay
                for p in layer.values():
                    p["res"].copy_(p["res0"])
            graph.replay()
            torch.cuda.synchronize()
            outputs[mode] = [o.clone() for o in results]
        times = {mode: bench_ms(graph.replay) for mode, graph in graphs.items()}
        del graphs
        need = lora_bytes(min(distinct, t), t, r) * args.layers
        print(f"{distinct} distinct adapters: LoRA bytes {need / 1e9:.3f} GB a step")
        base = times.get("base")
        for mode, ms in times.items():
            line = f"  {mode:<8} {ms:7.3f} ms"
            if base is not None and mode != "base":
                extra = ms - base
                line += f"  LoRA +{extra:.3f} ms = {need / (extra * 1e-3) / bw:.0%} of copy bandwidth"
                line += f", base / this = {base / ms:.3f}"
            if "serial" in outputs and "base" in outputs and mode not in ("base", "serial"):
                worst = max(
                    ((o - s).float().abs().max() / (s.float() - b.float()).abs().max().clamp_min(1e-6)).item()
                    for o, s, b in zip(outputs[mode], outputs["serial"], outputs["base"], strict=True)
                )
                line += f", max |this - serial| / max |LoRA term| = {worst:.2e}"
            print(line)


if __name__ == "__main__":
    main()
