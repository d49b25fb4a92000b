"""Benchmark and GPU checks of the multi-LoRA kernels.

    python -m benchmarks.kernels.lora_bench            # on a CUDA GPU (about 5 minutes)
    python -m benchmarks.kernels.lora_bench --cpu      # torch and Numba paths on CPU, 135M shapes

GPU sections, in order: (1) the device's ceilings (device-to-device copy bandwidth, bf16
matmul rate); (2) correctness against the float64 reference for every popularity pattern;
(3) CUDA-graph replay equals eager output bit for bit, and update + kernels never
synchronise with the host; (4) the target case (decode, batch 32, 32 distinct rank-16
adapters, the seven projections of one Llama-3-8B layer); (5) shrink+expand times over
tokens x rank x distinct adapters against a gather+bmm torch baseline. Variants of the
kernels are chosen by building a ``LoRAPlan``. With ``OUT`` set, a full log and a JSON file
are written there. A short table is printed last.

Bytes counted for bandwidth: the adapter weights of the adapters in use (true rank), x
read once, y read and written once. FLOPs: ``2 * T * rank * (S * in + out)``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
import traceback
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from multilora_studio.kernels import lora_cpu, lora_sgmv
from multilora_studio.kernels.lora import (
    LoRABatch,
    LoRAPlan,
    add_lora,
    build_lora_batch,
    lora_expand,
    lora_shrink,
)
from multilora_studio.kernels.lora_reference import reference_lora, reference_shrink

log = logging.getLogger("benchmarks.kernels.lora_bench")

# name: (in_features, output slice widths)
LLAMA3_8B = {
    "qkv": (4096, (4096, 1024, 1024)),
    "o": (4096, (4096,)),
    "gate_up": (4096, (14336, 14336)),
    "down": (14336, (4096,)),
}
SMOL_135M = {
    "qkv": (576, (576, 192, 192)),
    "o": (576, (576,)),
    "gate_up": (576, (1536, 1536)),
    "down": (1536, (576,)),
}
TOL = {torch.float32: 2e-5, torch.bfloat16: 1.5e-2, torch.float16: 2e-3}
PATTERNS = ("distinct", "uniform", "zipf", "identical", "all_none", "base_mixed")


def make_weights(
    shapes: dict[str, tuple[int, tuple[int, ...]]],
    num_slots: int,
    max_rank: int,
    ranks: list[int],
    dtype: torch.dtype,
    device: str,
    gen: torch.Generator,
) -> dict[str, tuple[torch.Tensor, torch.Tensor, tuple[int, ...]]]:
    """Random adapters; rank rows beyond each slot's rank are zero (the storage layout)."""
    out = {}
    rank_t = torch.tensor(ranks, device=device)
    r_idx = torch.arange(max_rank, device=device)
    keep = (r_idx[None, :] < rank_t[:, None]).to(dtype)  # [L, R]
    for name, (k, widths) in shapes.items():
        offs = [0]
        for w in widths:
            offs.append(offs[-1] + w)
        a = torch.randn(num_slots, len(widths), max_rank, k, device=device, dtype=dtype, generator=gen)
        a.mul_(k**-0.5).mul_(keep[:, None, :, None])
        b = torch.randn(num_slots, offs[-1], max_rank, device=device, dtype=dtype, generator=gen)
        b.mul_(0.25).mul_(keep[:, None, :])
        out[name] = (a, b, tuple(offs))
    return out


def make_slots(pattern: str, t: int, active: list[int], gen: torch.Generator) -> torch.Tensor:
    act = torch.tensor(active)
    if pattern == "distinct":
        slots = act[torch.randperm(len(active), generator=gen)][torch.arange(t) % len(active)]
    elif pattern == "uniform":
        slots = act[torch.randint(0, len(active), (t,), generator=gen)]
    elif pattern == "zipf":
        p = 1.0 / torch.arange(1, len(active) + 1, dtype=torch.float64) ** 1.5
        slots = act[torch.multinomial(p, t, replacement=True, generator=gen)]
    elif pattern == "identical":
        slots = torch.full((t,), active[0])
    elif pattern == "all_none":
        slots = torch.full((t,), -1)
    elif pattern == "blocks":  # prefill: each adapter's tokens in one run
        slots = act[torch.arange(t) * len(active) // t]
    elif pattern == "base_mixed":
        slots = act[torch.randint(0, len(active), (t,), generator=gen)]
        slots[torch.rand(t, generator=gen) < 0.35] = -1
    else:
        raise ValueError(pattern)
    return slots.to(torch.int32)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def bench_ms(fn: Callable[[], object], rep: int = 40) -> float:
    import triton

    return float(triton.testing.do_bench(fn, warmup=10, rep=rep, return_mode="median"))


def capture(fn: Callable[[], object]) -> torch.cuda.CUDAGraph:
    """Warm up on a side stream (compiles), then capture ``fn`` in a CUDA graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    torch.cuda.synchronize()
    return graph


def gather_bmm(y: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, slots, offs):
    """Baseline: gather each token's A and B, then batched matmuls (all tokens have a slot)."""
    t = x.shape[0]
    _, num_slices, r, k = a.shape
    ag = a[slots]  # [T, S, R, K]
    h = torch.bmm(ag.view(t, num_slices * r, k), x.unsqueeze(-1))  # [T, S*R, 1]
    bg = b[slots]  # [T, N, R]
    for s in range(num_slices):
        lo, hi = offs[s], offs[s + 1]
        y[:, lo:hi] += torch.bmm(bg[:, lo:hi], h[:, s * r : (s + 1) * r]).squeeze(-1)


def layer_bytes(shapes, t: int, ranks_used: list[int], elem: int) -> float:
    """Bytes of one layer: weights of the adapters in use (true rank), x read, y read+written."""
    nbytes = 0.0
    for k, widths in shapes.values():
        n = sum(widths)
        nbytes += sum(r * (len(widths) * k + n) for r in ranks_used) * elem
        nbytes += t * k * elem + 2 * t * n * elem
    return nbytes


def layer_flops(shapes, token_ranks: list[int]) -> float:
    """FLOPs of one layer: ``2 * rank * (S * in + out)`` per token (its adapter's rank)."""
    flops = 0.0
    for k, widths in shapes.values():
        n = sum(widths)
        flops += sum(2.0 * r * (len(widths) * k + n) for r in token_ranks)
    return flops


class Report:
    def __init__(self, out_dir: Path | None):
        self.out_dir = out_dir
        self.data: dict[str, Any] = {}
        self.summary: list[str] = []

    def save(self) -> None:
        if self.out_dir is not None:
            (self.out_dir / "lora_bench.json").write_text(json.dumps(self.data, indent=1))


# ------------------------------------------------------------------------------ sections


def section_env(rep: Report) -> None:
    import triton

    props = torch.cuda.get_device_properties(0)
    env = {
        "device": props.name,
        "sms": props.multi_processor_count,
        "memory_gib": round(props.total_memory / 2**30, 1),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
    }
    log.info("env %s", env)
    rep.data["env"] = env


def section_ceilings(rep: Report) -> None:
    n = 2 << 30  # 2 GiB copy
    bufs = [torch.empty(n, dtype=torch.uint8, device="cuda").random_() for _ in range(2)]
    ms = bench_ms(lambda: bufs[1].copy_(bufs[0]), rep=100)
    copy_bw = 2 * n / (ms * 1e-3)
    bufs.clear()
    m = 8192
    gen = torch.Generator(device="cuda").manual_seed(1)
    a = torch.randn(m, m, device="cuda", dtype=torch.bfloat16, generator=gen)
    b = torch.randn(m, m, device="cuda", dtype=torch.bfloat16, generator=gen)
    c = torch.empty_like(a)
    ms_mm = bench_ms(lambda: torch.mm(a, b, out=c), rep=100)
    tflops = 2 * m**3 / (ms_mm * 1e-3) / 1e12
    rep.data["ceilings"] = {"copy_bw_TBs": copy_bw / 1e12, "bf16_mm_TFLOPs": tflops}
    log.info("ceilings: copy %.2f TB/s (read+write), bf16 mm %.0f TFLOP/s", copy_bw / 1e12, tflops)
    rep.summary.append(f"ceilings: copy {copy_bw / 1e12:.2f} TB/s, bf16 mm {tflops:.0f} TFLOP/s")


def check_case(weights, slots, rank_t, num_slots, gen) -> tuple[bool, float]:
    """add_lora and, for qkv, the public shrink + expand on every projection vs the
    reference."""
    batch = build_lora_batch(slots, rank_t, num_slots)
    t = slots.shape[0]
    keep = slots < 0  # rows that must stay bit for bit (poisoned with NaN)
    worst, ok = 0.0, True
    for name, (a, b, offs) in weights.items():
        dtype = a.dtype
        x = torch.randn(t, a.shape[3], device="cuda", generator=gen).to(dtype)
        y0 = torch.randn(t, offs[-1], device="cuda", generator=gen).to(dtype)
        y0[keep] = float("nan")
        ref = reference_lora(y0, x, a, b, slots, offs)
        outs = [add_lora(y0.clone(), x, a, b, batch, offs)]
        if name == "qkv":
            buf = lora_shrink(x, a, batch)
            outs.append(lora_expand(y0.clone(), buf, b, batch, offs))
            ranks = rank_t[slots.clamp_min(0).long()]  # [T]
            r_idx = torch.arange(a.shape[2], device="cuda")
            must = ((slots >= 0)[:, None] & (r_idx[None, :] < ranks[:, None])).expand_as(buf)
            if must.any():  # buf is float32 math on exact products: near exact
                rs = reference_shrink(x, a, slots)
                ok = ok and rel_err(buf[must], rs[must]) < 1e-4
        for y in outs:
            ok = ok and torch.equal(y[keep].view(torch.int8), y0[keep].view(torch.int8))
            if (~keep).any():
                err = rel_err(y[~keep], ref[~keep])
                worst = max(worst, err)
                ok = ok and bool(torch.isfinite(y[~keep]).all()) and err < TOL[dtype]
    return ok, worst


def section_correctness(rep: Report) -> None:
    """Every pattern, dtypes and a range of token counts, at Llama and 135M shapes."""
    gen = torch.Generator(device="cuda").manual_seed(2)
    cpu_gen = torch.Generator().manual_seed(2)
    num_slots = 12
    ranks = [8, 16, 64, 4, 32, 16, 8, 64, 16, 12, 0, 16]
    active = [i for i, r in enumerate(ranks) if r > 0]
    rank_t = torch.tensor(ranks, dtype=torch.int32, device="cuda")
    plan = [
        (torch.bfloat16, "llama3_8b", LLAMA3_8B, (1, 7, 32, 33, 257, 1030)),
        (torch.bfloat16, "smol_135m", SMOL_135M, (1, 7, 33, 257)),
        (torch.float16, "smol_135m", SMOL_135M, (1, 33, 257)),
        (torch.float32, "smol_135m", SMOL_135M, (1, 33, 257)),
        (torch.float16, "llama3_8b", LLAMA3_8B, (5, 64)),
        (torch.float32, "llama3_8b", LLAMA3_8B, (5, 64)),
    ]
    results: list[dict[str, Any]] = []
    failures = 0
    for dtype, shapes_name, shapes, token_counts in plan:
        weights = make_weights(shapes, num_slots, 64, ranks, dtype, "cuda", gen)
        for t in token_counts:
            for pattern in PATTERNS:
                slots = make_slots(pattern, t, active, cpu_gen).cuda()
                ok, worst = check_case(weights, slots, rank_t, num_slots, gen)
                failures += not ok
                results.append(
                    {
                        "dtype": str(dtype),
                        "shapes": shapes_name,
                        "tokens": t,
                        "pattern": pattern,
                        "rel_err": worst,
                        "ok": ok,
                    }
                )
                if not ok:
                    log.error("FAIL %s %s T=%d %s err=%.3e", dtype, shapes_name, t, pattern, worst)
    # NaN beyond each slot's rank must never be read.
    weights = make_weights(LLAMA3_8B, num_slots, 64, ranks, torch.bfloat16, "cuda", gen)
    slots = make_slots("uniform", 40, active, cpu_gen).cuda()
    batch = build_lora_batch(slots, rank_t, num_slots)
    nan_ok = True
    for a, b, offs in weights.values():
        pad_a, pad_b = a.clone(), b.clone()
        for slot, r in enumerate(ranks):
            pad_a[slot, :, r:] = float("nan")
            pad_b[slot, :, r:] = float("nan")
        x = torch.randn(40, a.shape[3], device="cuda", generator=gen).bfloat16()
        y = torch.randn(40, offs[-1], device="cuda", generator=gen).bfloat16()
        ref = reference_lora(y, x, a, b, slots, offs)
        add_lora(y, x, pad_a, pad_b, batch, offs)
        nan_ok = nan_ok and rel_err(y, ref) < TOL[torch.bfloat16]
    failures += not nan_ok
    worst_of = {str(d): max(r["rel_err"] for r in results if r["dtype"] == str(d)) for d in TOL}
    rep.data["correctness"] = {
        "cases": len(results),
        "failures": failures,
        "worst_rel_err": worst_of,
        "rank_padding_never_read": nan_ok,
        "results": results,
    }
    log.info("correctness: %d cases, %d failures, worst %s", len(results), failures, worst_of)
    rep.summary.append(
        f"correctness: {len(results)} cases x 4 projections, {failures} failures, "
        f"rank padding never read: {nan_ok}"
    )


def section_graph(rep: Report) -> None:
    """Graph replay == eager bitwise; update + kernels never synchronise with the host."""
    gen = torch.Generator(device="cuda").manual_seed(3)
    cpu_gen = torch.Generator().manual_seed(3)
    num_slots, max_tokens = 32, 64
    ranks = [16, 8, 64, 32] * 8
    weights = make_weights(LLAMA3_8B, num_slots, 64, ranks, torch.bfloat16, "cuda", gen)
    rank_t = torch.tensor(ranks, dtype=torch.int32, device="cuda")
    batch = LoRABatch.allocate(max_tokens, num_slots, "cuda")
    t = 48  # a batch-size bucket; steps with fewer tokens pad slot_ids with -1
    xs = {
        n: torch.empty(t, a.shape[3], device="cuda", dtype=torch.bfloat16) for n, (a, _, _) in weights.items()
    }
    ys = {n: torch.empty(t, o[-1], device="cuda", dtype=torch.bfloat16) for n, (_, _, o) in weights.items()}

    def step() -> None:
        for n, (a, b, offs) in weights.items():
            add_lora(ys[n], xs[n], a, b, batch, offs)

    def fill(slots: torch.Tensor) -> dict[str, torch.Tensor]:
        batch.update(slots, rank_t)
        y0 = {}
        for n in weights:
            xs[n].normal_(generator=gen)
            ys[n].normal_(generator=gen)
            y0[n] = ys[n].clone()
        return y0

    slots0 = make_slots("uniform", t, list(range(num_slots)), cpu_gen).cuda()
    fill(slots0)
    graph = capture(step)
    results = []
    for pattern in ("distinct", "zipf", "base_mixed", "identical", "all_none"):
        active = list(range(num_slots))
        slots = make_slots(pattern, t, active, cpu_gen).cuda()
        if pattern == "zipf":  # a shorter step padded to the bucket
            slots[37:] = -1
        y0 = fill(slots)
        step()
        eager = {n: ys[n].clone() for n in weights}
        for n in weights:
            ys[n].copy_(y0[n])
        graph.replay()
        torch.cuda.synchronize()
        same = all(torch.equal(eager[n].view(torch.int16), ys[n].view(torch.int16)) for n in weights)
        results.append({"pattern": pattern, "bitwise_equal": same})
    # No host synchronisation in update + kernels (the engine's decode step relies on it).
    slots = make_slots("uniform", t, list(range(num_slots)), cpu_gen).cuda()
    torch.cuda.synchronize()
    sync_free = True
    try:
        torch.cuda.set_sync_debug_mode("error")
        batch.update(slots, rank_t)
        step()
    except RuntimeError as exc:
        sync_free = False
        log.error("host synchronisation: %s", exc)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    all_equal = all(r["bitwise_equal"] for r in results)
    rep.data["graph"] = {
        "results": results,
        "bitwise_equal": all_equal,
        "sync_free": sync_free,
    }
    log.info("graph: %s sync_free=%s", results, sync_free)
    rep.summary.append(f"graph replay == eager bitwise: {all_equal}; no host sync: {sync_free}")


def section_update_graph(rep: Report) -> None:
    """LoRABatch.update captured in the same graph as the kernels (run last: a failed
    capture can leave the CUDA context unusable)."""
    gen = torch.Generator(device="cuda").manual_seed(8)
    cpu_gen = torch.Generator().manual_seed(8)
    num_slots, t = 16, 24
    ranks = [16, 8] * 8
    weights = make_weights(LLAMA3_8B, num_slots, 16, ranks, torch.bfloat16, "cuda", gen)
    rank_t = torch.tensor(ranks, dtype=torch.int32, device="cuda")
    batch = LoRABatch.allocate(64, num_slots, "cuda")
    xs = {
        n: torch.randn(t, a.shape[3], device="cuda", generator=gen).bfloat16()
        for n, (a, _, _) in weights.items()
    }
    ys = {
        n: torch.randn(t, o[-1], device="cuda", generator=gen).bfloat16() for n, (_, _, o) in weights.items()
    }
    slots = make_slots("uniform", t, list(range(num_slots)), cpu_gen).cuda()

    def step() -> None:
        batch.update(slots, rank_t)
        for n, (a, b, offs) in weights.items():
            add_lora(ys[n], xs[n], a, b, batch, offs)

    try:
        graph = capture(step)
        slots.copy_(make_slots("base_mixed", t, list(range(num_slots)), cpu_gen).cuda())
        y0 = {n: ys[n].clone() for n in weights}
        graph.replay()
        torch.cuda.synchronize()
        replay = {n: ys[n].clone() for n in weights}
        for n in weights:
            ys[n].copy_(y0[n])
        step()
        ok = all(torch.equal(replay[n].view(torch.int16), ys[n].view(torch.int16)) for n in weights)
    except RuntimeError as exc:
        ok = False
        log.error("update() capture: %s", exc)
    rep.data["update_capturable"] = ok
    rep.summary.append(f"update() + kernels in one graph, replay == eager bitwise: {ok}")


def layer_inputs(weights, t: int, gen: torch.Generator):
    dtype = next(iter(weights.values()))[0].dtype
    xs = {
        n: torch.randn(t, a.shape[3], device="cuda", generator=gen).to(dtype)
        for n, (a, _, _) in weights.items()
    }
    ys = {
        n: torch.randn(t, o[-1], device="cuda", generator=gen).to(dtype) for n, (_, _, o) in weights.items()
    }
    return xs, ys


def steady_us(layer_fns: list[Callable[[], None]], reps: int) -> float:
    """GPU time of one layer in steady state: one graph replays ``reps`` rounds over the
    layers (each on its own weight copy, so the 60 MB L2 does not hold them), as a
    whole-model decode graph would; graph launch cost is spread over all layers."""

    def body() -> None:
        for _ in range(reps):
            for fn in layer_fns:
                fn()

    graph = capture(body)
    us = bench_ms(graph.replay) * 1e3 / (reps * len(layer_fns))
    del graph
    return us


def layer_runners(
    copies, t: int, slots: torch.Tensor, rank_t, num_slots: int, gen, kind: str, cfg=None, plan=None
):
    """One callable per weight copy running a layer's four LoRA projections.

    kind: "api" (add_lora with ``plan``), "tiles" (the slot-grouped launchers with
    ``cfg(name) -> (shrink config, expand config)``) or "gather_bmm" (the torch baseline).
    """
    batch = build_lora_batch(slots, rank_t, num_slots)
    slots_long = slots.long()
    fns = []
    for weights in copies:
        xs, ys = layer_inputs(weights, t, gen)

        def fn(weights=weights, xs=xs, ys=ys) -> None:
            for n, (a, b, offs) in weights.items():
                if kind == "api":
                    add_lora(ys[n], xs[n], a, b, batch, offs, plan)
                elif kind == "tiles":
                    scfg, ecfg = cfg(n)
                    part = lora_sgmv.shrink_partials(xs[n], a, batch, config=scfg)
                    lora_sgmv.expand(ys[n], part, b, batch, offs, config=ecfg)
                else:
                    gather_bmm(ys[n], xs[n], a, b, slots_long, offs)

        fns.append(fn)
    return fns


def section_target(rep: Report, deadline: float) -> None:
    """Decode batch 32, 32 distinct rank-16 adapters, all seven projections of one layer."""
    gen = torch.Generator(device="cuda").manual_seed(4)
    cpu_gen = torch.Generator().manual_seed(4)
    num_slots, t, r, ncopy, reps = 32, 32, 16, 3, 4
    ranks = [r] * num_slots
    copies = [make_weights(LLAMA3_8B, num_slots, r, ranks, torch.bfloat16, "cuda", gen) for _ in range(ncopy)]
    rank_t = torch.tensor(ranks, dtype=torch.int32, device="cuda")
    slots = make_slots("distinct", t, list(range(num_slots)), cpu_gen).cuda()
    nbytes = layer_bytes(LLAMA3_8B, t, [r] * num_slots, 2)
    bw = rep.data.get("ceilings", {}).get("copy_bw_TBs", 4.3) * 1e12
    shipped = LoRAPlan.for_device("cuda", torch.bfloat16)

    def run(kind: str, plan: LoRAPlan = shipped) -> float:
        return steady_us(layer_runners(copies, t, slots, rank_t, num_slots, gen, kind, plan=plan), reps)

    res: dict[str, Any] = {"bytes": nbytes, "flops": layer_flops(LLAMA3_8B, [r] * t)}
    res["ours_us"] = run("api")
    res["gather_bmm_us"] = run("gather_bmm")
    # Eager (host-bound: Python + launch cost of 4 add_lora calls per layer).
    batch = build_lora_batch(slots, rank_t, num_slots)
    xs, ys = layer_inputs(copies[0], t, gen)
    res["ours_eager_us"] = 1e3 * bench_ms(
        lambda: [add_lora(ys[n], xs[n], a, b, batch, o, shipped) for n, (a, b, o) in copies[0].items()]
    )
    for key in ("ours", "gather_bmm"):
        res[f"{key}_bw_pct"] = 100 * nbytes / (res[f"{key}_us"] * 1e-6) / bw
    res["speedup"] = res["gather_bmm_us"] / res["ours_us"]
    per = {}
    for n, shape in LLAMA3_8B.items():
        sub = [{n: w[n]} for w in copies]
        us = steady_us(layer_runners(sub, t, slots, rank_t, num_slots, gen, "api", plan=shipped), reps)
        pb = layer_bytes({n: shape}, t, [r] * num_slots, 2)
        per[n] = {"us": us, "bytes": pb, "bw_pct": 100 * pb / (us * 1e-6) / bw}
    res["per_projection"] = per
    rep.data["target"] = res
    log.info("target: %s", res)
    rep.summary.append(
        f"TARGET decode T=32, 32 distinct rank-16, 7 projections ({nbytes / 1e6:.1f} MB): "
        f"{res['ours_us']:.1f} us = {res['ours_bw_pct']:.0f}% of copy bandwidth, "
        f"{res['speedup']:.1f}x gather+bmm ({res['gather_bmm_us']:.1f} us); eager "
        f"{res['ours_eager_us']:.1f} us (host-bound)"
    )
    rep.summary.append(
        "  per projection: " + ", ".join(f"{n} {v['us']:.1f} us {v['bw_pct']:.0f}%" for n, v in per.items())
    )
    # Variants of the same measurement: without programmatic dependent launch, and the
    # slot-grouped kernels that serve token counts above LoRAPlan.bgmv_max_tokens.
    variants = (("no_pdl", replace(shipped, pdl=False)), ("grouped", replace(shipped, bgmv_max_tokens=0)))
    for name, variant in variants:
        try:
            us = run("api", variant)
        except Exception as exc:
            log.info("variant %s failed: %s", name, exc)
            continue
        res[f"{name}_us"] = us
        res[f"{name}_bw_pct"] = 100 * nbytes / (us * 1e-6) / bw
        rep.summary.append(f"  variant {name}: {us:.1f} us = {res[f'{name}_bw_pct']:.0f}% of copy bandwidth")
    # Tile sweep of the token-major kernels (same measurement), expand first, then shrink.
    sweep: list[dict[str, Any]] = []
    res["sweep"] = sweep
    best: dict[str, Any] = {}
    stages = (
        [{"bgmv_expand_tile": tile, "bgmv_expand_warps": w} for tile in (8192, 16384, 32768) for w in (4, 8)],
        [{"bgmv_shrink_tile": tile, "bgmv_shrink_warps": w} for tile in (8192, 16384, 32768) for w in (4, 8)],
    )
    for stage in stages:
        stage_best: tuple[float, dict[str, Any]] | None = None
        for settings in stage:
            if time.monotonic() > deadline:
                break
            trial = {**best, **settings}
            try:
                us = run("api", replace(shipped, **trial))
            except Exception as exc:
                log.info("sweep config %s failed: %s", trial, exc)
                continue
            row = {**trial, "us": us, "bw_pct": 100 * nbytes / (us * 1e-6) / bw}
            sweep.append(row)
            log.info("target sweep %s", row)
            if stage_best is None or us < stage_best[0]:
                stage_best = (us, settings)
        if stage_best is not None:
            best.update(stage_best[1])
    if sweep:
        top = min(sweep, key=lambda row: float(row["us"]))
        res["best"] = top
        rep.summary.append(f"  best token-major tiles in sweep: {top}")


def section_decode_paths(rep: Report, deadline: float) -> None:
    """Token-major vs slot-grouped kernels at decode sizes, distinct and identical adapters
    (where the token-major kernels re-read one adapter's tiles from L2): sets the crossover
    LoRAPlan.bgmv_max_tokens."""
    gen = torch.Generator(device="cuda").manual_seed(6)
    cpu_gen = torch.Generator().manual_seed(6)
    num_slots, r, ncopy, reps = 64, 16, 2, 2
    ranks = [r] * num_slots
    copies = [make_weights(LLAMA3_8B, num_slots, r, ranks, torch.bfloat16, "cuda", gen) for _ in range(ncopy)]
    rank_t = torch.tensor(ranks, dtype=torch.int32, device="cuda")
    shipped = LoRAPlan.for_device("cuda", torch.bfloat16)
    paths = (
        ("token_major", replace(shipped, bgmv_max_tokens=1 << 20)),
        ("grouped", replace(shipped, bgmv_max_tokens=0)),
    )
    rows: list[dict[str, object]] = []
    rep.data["decode_paths"] = rows
    for t in (1, 8, 32, 64, 128, 256):
        for pattern in ("distinct", "uniform", "identical"):
            if time.monotonic() > deadline:
                return
            slots = make_slots(pattern, t, list(range(min(t, num_slots))), cpu_gen).cuda()
            row: dict[str, object] = {"tokens": t, "pattern": pattern}
            for path, plan in paths:
                fns = layer_runners(copies, t, slots, rank_t, num_slots, gen, "api", plan=plan)
                row[f"{path}_us"] = steady_us(fns, reps)
            rows.append(row)
            log.info("decode paths %s", row)
    rep.summary.append(
        "decode paths (us/layer token-major | grouped): "
        + "; ".join(
            f"T={row['tokens']} {row['pattern']} {row['token_major_us']:.1f} | {row['grouped_us']:.1f}"
            for row in rows
        )
    )


def section_matrix(rep: Report, quick: bool, deadline: float) -> None:
    gen = torch.Generator(device="cuda").manual_seed(5)
    cpu_gen = torch.Generator().manual_seed(5)
    num_slots, ncopy, reps = 64, 2, 2
    bw = rep.data.get("ceilings", {}).get("copy_bw_TBs", 4.3) * 1e12
    peak = rep.data.get("ceilings", {}).get("bf16_mm_TFLOPs", 790.0) * 1e12
    tokens: tuple[int, ...] = (1, 8, 32, 64, 128, 256, 512, 2048, 8192)
    ranks_list: tuple[int, ...] = (8, 16, 64)
    distincts: tuple[int, ...] = (1, 8, 32, 64)
    if quick:
        tokens, ranks_list, distincts = (1, 32, 128, 256, 2048), (16, 64), (1, 32)
    rows: list[dict[str, Any]] = []
    rep.data["matrix"] = rows
    sets: dict[int | str, tuple[list[int], list, torch.Tensor]] = {}
    rank_choices: list[int | str] = [*ranks_list, "mixed"]
    for r in rank_choices:
        ranks = [8, 16, 32, 64] * (num_slots // 4) if isinstance(r, str) else [r] * num_slots
        copies = [
            make_weights(LLAMA3_8B, num_slots, max(ranks), ranks, torch.bfloat16, "cuda", gen)
            for _ in range(ncopy)
        ]
        sets[r] = (ranks, copies, torch.tensor(ranks, dtype=torch.int32, device="cuda"))
    for t in tokens:
        for r, (ranks, copies, rank_t) in sets.items():
            for d in distincts:
                if d > t or (r == "mixed" and d < 8):
                    continue
                if time.monotonic() > deadline:
                    log.warning("matrix: time budget reached, stopping")
                    return
                decode = t <= 256
                slots = make_slots("distinct" if decode else "blocks", t, list(range(d)), cpu_gen).cuda()
                row: dict[str, Any] = {"rank": r, "tokens": t, "distinct": d}
                if decode:
                    for kind in ("api", "gather_bmm"):
                        fns = layer_runners(copies, t, slots, rank_t, num_slots, gen, kind)
                        row[f"{kind}_us"] = steady_us(fns, reps)
                    row["speedup"] = row["gather_bmm_us"] / row["api_us"]
                else:
                    fns = layer_runners(copies[:1], t, slots, rank_t, num_slots, gen, "api")
                    row["api_us"] = 1e3 * bench_ms(fns[0])
                used = [ranks[i] for i in range(d)]
                nbytes = layer_bytes(LLAMA3_8B, t, used, 2)
                flops = layer_flops(LLAMA3_8B, [ranks[int(s)] for s in slots.tolist()])
                row["bytes"] = nbytes
                row["flops"] = flops
                row["bw_pct"] = 100 * nbytes / (row["api_us"] * 1e-6) / bw
                row["flop_pct"] = 100 * flops / (row["api_us"] * 1e-6) / peak
                rows.append(row)
                log.info("matrix %s", row)


def run_gpu(args: argparse.Namespace, rep: Report) -> None:
    start = time.monotonic()
    sections: list[tuple[str, Callable[[], None]]] = [
        ("env", lambda: section_env(rep)),
        ("ceilings", lambda: section_ceilings(rep)),
        ("correctness", lambda: section_correctness(rep)),
        ("graph", lambda: section_graph(rep)),
        ("target", lambda: section_target(rep, start + args.budget * 0.45)),
        ("decode_paths", lambda: section_decode_paths(rep, start + args.budget * 0.65)),
        ("matrix", lambda: section_matrix(rep, args.quick, start + args.budget)),
        ("update_graph", lambda: section_update_graph(rep)),
    ]
    if args.sections:
        wanted = set(args.sections.split(","))
        sections = [(name, fn) for name, fn in sections if name in wanted or name in ("env", "ceilings")]
    for name, fn in sections:
        t0 = time.monotonic()
        try:
            fn()
        except Exception:
            log.error("section %s failed:\n%s", name, traceback.format_exc())
            rep.summary.append(f"section {name} FAILED (see log)")
        log.info("section %s took %.1f s", name, time.monotonic() - t0)
        rep.save()
    rows = rep.data.get("matrix", [])
    if rows:
        lines = ["rank tokens distinct | ours us | gather+bmm us | speedup | bw% of copy | flop%"]
        for r in rows:
            base = r.get("gather_bmm_us")
            lines.append(
                f"{r['rank']!s:>5} {r['tokens']:>6} {r['distinct']:>3} | {r['api_us']:8.1f} | "
                + (f"{base:8.1f} | {r['speedup']:5.1f}x" if base else "       - |     -")
                + f" | {r['bw_pct']:4.0f} | {r['flop_pct']:5.1f}"
            )
        rep.summary.extend(lines)


# ----------------------------------------------------------------------------------- CPU


def run_cpu(rep: Report) -> None:
    """Torch and Numba backends on the CPU at the 135M default model's shapes, per layer."""
    gen = torch.Generator().manual_seed(7)
    num_slots, r = 8, 16
    weights = make_weights(SMOL_135M, num_slots, r, [r] * num_slots, torch.float32, "cpu", gen)
    base_w = {n: torch.randn(sum(w), k, generator=gen) * 0.02 for n, (k, w) in SMOL_135M.items()}
    rank_t = torch.full((num_slots,), r, dtype=torch.int32)
    rows = []

    def best_us(fn: Callable[[], None], n: int = 20) -> float:
        best = float("inf")
        for _ in range(7):
            for _ in range(2):
                fn()
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            best = min(best, (time.perf_counter() - t0) / n * 1e6)
        return best

    # the engine's CPU layout for the Numba kernel: B stored rank-major, passed transposed
    weights_t = {
        n: (a, b.transpose(1, 2).contiguous().transpose(1, 2), offs) for n, (a, b, offs) in weights.items()
    }
    numba_ok = lora_cpu.AVAILABLE
    torch_plan = LoRAPlan(backend="torch")
    numba_plan = LoRAPlan(backend="numba", numba_max_tokens=1 << 20) if numba_ok else None  # every size
    for t, d in ((1, 1), (4, 4), (8, 1), (8, 8), (32, 8), (64, 8), (128, 8), (256, 1), (256, 4)):
        slots = (torch.arange(t) % d).int() if t <= 8 else (torch.arange(t) * d // t).int()
        batch = build_lora_batch(slots, rank_t, num_slots)
        xs = {n: torch.randn(t, k, generator=gen) for n, (k, _) in SMOL_135M.items()}
        ys = {n: torch.randn(t, sum(w), generator=gen) for n, (_, w) in SMOL_135M.items()}

        def base(xs=xs) -> None:
            for n in SMOL_135M:
                torch.nn.functional.linear(xs[n], base_w[n])

        def lora(xs=xs, ys=ys, batch=batch) -> None:
            for n, (a, b, offs) in weights.items():
                add_lora(ys[n], xs[n], a, b, batch, offs, torch_plan)

        def lora_numba(xs=xs, ys=ys, batch=batch) -> None:
            for n, (a, b, offs) in weights_t.items():
                add_lora(ys[n], xs[n], a, b, batch, offs, numba_plan)

        def step(slots=slots, batch=batch) -> None:
            batch.update(slots, rank_t)

        row = {
            "tokens": t,
            "distinct": d,
            "base_linear_us": best_us(base),
            "lora_us": best_us(lora),
            "lora_numba_us": best_us(lora_numba) if numba_ok else None,
            "update_us": best_us(step),
        }
        rows.append(row)
        numba_us = "-" if row["lora_numba_us"] is None else f"{row['lora_numba_us']:6.0f}"
        rep.summary.append(
            f"cpu T={t:>3} distinct={d}: base linears {row['base_linear_us']:7.0f} us/layer, "
            f"LoRA torch {row['lora_us']:6.0f} / numba {numba_us} us/layer, "
            f"batch.update {row['update_us']:4.0f} us/step"
        )
    rep.data["cpu"] = {"threads": torch.get_num_threads(), "rows": rows}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smaller timing matrix")
    parser.add_argument("--cpu", action="store_true", help="time the torch and Numba paths on the CPU")
    parser.add_argument(
        "--sections",
        default="",
        help="comma-separated GPU sections to run (correctness, graph, target, decode_paths, matrix, "
        "update_graph); default all",
    )
    parser.add_argument("--budget", type=float, default=280.0, help="seconds for all GPU sections")
    args = parser.parse_args(argv)
    out_dir = Path(os.environ["OUT"]) if os.environ.get("OUT") else None
    handlers: list[logging.Handler] = [logging.StreamHandler()]
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(out_dir / "lora_bench.log"))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", handlers=handlers)
    rep = Report(out_dir)
    if args.cpu:
        run_cpu(rep)
    elif not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run with --cpu for the torch path")
    else:
        run_gpu(args, rep)
    rep.save()
    summary = "\n".join(rep.summary)
    if out_dir is not None:
        (out_dir / "lora_bench_summary.txt").write_text(summary + "\n")
    log.info("==== LoRA kernels ====\n%s", summary)


if __name__ == "__main__":
    main()
