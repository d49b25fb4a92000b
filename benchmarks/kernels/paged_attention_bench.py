"""GPU check and benchmark of paged attention (``python -m benchmarks.kernels.paged_attention_bench``).

Sections, each independent (a failure is logged and the next section runs):

1. correctness on CUDA against the float64 reference: decode, prefill, mixed steps at
   Llama-3-8B shapes (Hq=32, Hkv=8, D=128, bf16), plus fp16/fp32 and GQA 1, and write_kv;
2. a decode step (write_kv + attention, padded bucket, split-K) captured in a CUDA graph and
   replayed on new inputs: equal to eager bit for bit;
3. timings (``triton.testing.do_bench`` median, L2 flushed between runs): decode batch 1..64 x
   context 128..4096 through CUDA-graph replay, with KV-read bandwidth against a measured
   device-to-device copy ceiling; prefill 512..8192 tokens in TFLOP/s; a mixed step; torch
   SDPA (flash) on a contiguous cache as the baseline;
4. with ``--sweep``: block/warp/stage variants of both kernels.

Writes ``paged_attention_bench.json`` and ``.log`` under ``$OUT`` when set; prints a short table
last.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from multilora_studio.kernels.paged_attention import (
    paged_attention,
    reference_paged_attention,
    write_kv,
)

log = logging.getLogger("paged_attention_bench")

HQ, HKV, D, BS = 32, 8, 128, 16  # Llama-3-8B attention shapes, block size 16
TOL = {torch.float32: 1e-3, torch.bfloat16: 2e-2, torch.float16: 4e-3}  # relative L2 error


def make_step(
    seqs: list[tuple[int, int]],
    hq: int,
    hkv: int,
    d: int,
    dtype: torch.dtype,
    device: str,
    gen: torch.Generator,
    extra_blocks: int = 8,
    table_width: int | None = None,
) -> dict[str, Any]:
    """Random step over a cache whose physical blocks are shuffled; seqs = (q_len, seq_len)."""
    nblocks = [-(-length // BS) for _, length in seqs]
    num_blocks = sum(nblocks) + extra_blocks
    perm = torch.randperm(num_blocks, generator=gen).to(torch.int32)
    width = table_width or max([*nblocks, 1])
    tables = torch.zeros(len(seqs), width, dtype=torch.int32)
    used = 0
    for i, n in enumerate(nblocks):
        tables[i, :n] = perm[used : used + n]
        used += n
    k_cache = torch.randn(num_blocks, BS, hkv, d, device=device, dtype=dtype)
    v_cache = torch.randn(num_blocks, BS, hkv, d, device=device, dtype=dtype)
    num_tokens = sum(q for q, _ in seqs)
    qsl = [0]
    for q_len, _ in seqs:
        qsl.append(qsl[-1] + q_len)
    return {
        "q": torch.randn(num_tokens, hq, d, device=device, dtype=dtype),
        "k_cache": k_cache,
        "v_cache": v_cache,
        "block_tables": tables.to(device),
        "seq_lens": torch.tensor([s for _, s in seqs], dtype=torch.int32, device=device),
        "query_start_loc": torch.tensor(qsl, dtype=torch.int32, device=device),
        "max_query_len": max(q for q, _ in seqs),
    }


TUNING = ("block_m", "block_n", "num_warps", "num_stages")


def call(step: dict[str, Any], out: torch.Tensor | None = None, **kw: Any) -> torch.Tensor:
    """paged_attention on a step; tile/warp/stage overrides go straight to the launcher."""
    s = step
    args = (s["q"], s["k_cache"], s["v_cache"], s["block_tables"], s["seq_lens"], s["query_start_loc"],
            s["q"].shape[-1] ** -0.5)  # fmt: skip
    max_query_len = kw.pop("max_query_len", s["max_query_len"])
    if any(name in kw for name in TUNING):
        from multilora_studio.kernels.paged_attention_triton import launch_paged_attention

        target = out if out is not None else torch.empty_like(s["q"])
        return launch_paged_attention(*args, target, max_query_len, **kw)
    return paged_attention(*args, out=out, max_query_len=max_query_len, **kw)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out64 = out.double().cpu()
    if not torch.isfinite(out64).all():
        return float("nan")
    return ((out64 - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def check_correctness(results: dict[str, Any]) -> None:
    gen = torch.Generator().manual_seed(0)
    rows = []
    decode = [(1, int(x)) for x in torch.randint(1, 3000, (16,), generator=gen)]
    mixed = [(300, 1000), (1, 2048), (1, 17), (64, 64), (1, 700), (5, 5)]
    cases: list[tuple[str, list[tuple[int, int]], int, int, torch.dtype, dict[str, Any]]] = [
        ("decode b16 bf16", decode, HQ, HKV, torch.bfloat16, {}),
        ("decode b16 bf16 split=1", decode, HQ, HKV, torch.bfloat16, {"num_splits": 1}),
        ("decode b3 bf16 split=16", decode[:3], HQ, HKV, torch.bfloat16, {"num_splits": 16}),
        ("prefill 1024 bf16", [(1024, 1024)], HQ, HKV, torch.bfloat16, {}),
        ("prefill 2x333 bf16", [(333, 333), (257, 257)], HQ, HKV, torch.bfloat16, {}),
        ("mixed bf16", mixed, HQ, HKV, torch.bfloat16, {}),
        ("mixed bf16 mql=None", mixed, HQ, HKV, torch.bfloat16, {"max_query_len": None}),
        ("mixed fp16", mixed, HQ, HKV, torch.float16, {}),
        ("mixed fp32", mixed, HQ, HKV, torch.float32, {}),
        ("decode fp32", decode, HQ, HKV, torch.float32, {}),
        ("mixed bf16 gqa1", mixed, 16, 16, torch.bfloat16, {}),
        ("mixed bf16 D64 gqa3", mixed, 9, 3, torch.bfloat16, {}),
        ("mixed bf16 torch backend", mixed, HQ, HKV, torch.bfloat16, {"backend": "torch"}),
    ]
    for name, seqs, hq, hkv, dtype, kw in cases:
        d = 64 if hq == 9 else D
        step = make_step(seqs, hq, hkv, d, dtype, "cuda", gen)
        out = torch.full_like(step["q"], float("nan"))
        call(step, out=out, **kw)
        torch.cuda.synchronize()
        ref = reference_paged_attention(
            step["q"], step["k_cache"], step["v_cache"], step["block_tables"], step["seq_lens"],
            step["query_start_loc"], d**-0.5,
        )  # fmt: skip
        err = rel_err(out, ref)
        ok = err <= TOL[dtype]
        rows.append({"case": name, "rel_err": err, "tol": TOL[dtype], "ok": ok})
        log.info(
            "correctness %-28s rel_err %.2e (tol %.0e) %s", name, err, TOL[dtype], "ok" if ok else "FAIL"
        )
    # write_kv with padding slots against plain indexing
    k_cache = torch.randn(64, BS, HKV, D, device="cuda", dtype=torch.bfloat16)
    v_cache = torch.randn_like(k_cache)
    slots = torch.randperm(64 * BS, device="cuda")[:40]
    slots[::7] = -1
    k = torch.randn(40, HKV, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    want_k, want_v = k_cache.clone(), v_cache.clone()
    keep = slots >= 0
    want_k.view(-1, HKV, D)[slots[keep]] = k[keep]
    want_v.view(-1, HKV, D)[slots[keep]] = v[keep]
    write_kv(k, v, k_cache, v_cache, slots)
    ok = bool(torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v))
    rows.append({"case": "write_kv padding slots", "rel_err": 0.0 if ok else float("nan"), "ok": ok})
    log.info("correctness write_kv padding slots %s", "ok" if ok else "FAIL")
    results["correctness"] = rows


def check_cuda_graph(results: dict[str, Any]) -> None:
    """Padded decode bucket (6 real sequences, 2 padding ones with seq_len 0) captured once,
    replayed on new inputs, compared bit for bit with eager calls on the same inputs."""
    gen = torch.Generator().manual_seed(1)
    bucket, real, width = 8, 6, 256  # table width fixes max_context = 4096 -> split-K on
    # enough blocks that every (sequence, logical block) gets its own physical block
    step = make_step([(1, 1500)] * bucket, HQ, HKV, D, torch.bfloat16, "cuda", gen,
                     extra_blocks=bucket * width, table_width=width)  # fmt: skip
    num_blocks = step["k_cache"].shape[0]
    static = {
        "k": torch.randn(bucket, HKV, D, device="cuda", dtype=torch.bfloat16),
        "v": torch.randn(bucket, HKV, D, device="cuda", dtype=torch.bfloat16),
        "slots": torch.full((bucket,), -1, dtype=torch.int64, device="cuda"),
        "out": torch.empty(bucket, HQ, D, device="cuda", dtype=torch.bfloat16),
    }
    step["query_start_loc"] = torch.arange(bucket + 1, dtype=torch.int32, device="cuda")

    def layer() -> None:
        write_kv(static["k"], static["v"], step["k_cache"], step["v_cache"], static["slots"])
        call(step, out=static["out"], max_query_len=1)

    def new_inputs(seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        lens = torch.randint(1, 4000, (real,), generator=g)
        tables = torch.randperm(num_blocks, generator=g)[: bucket * width].view(bucket, width).int()
        step["block_tables"].copy_(tables)
        step["seq_lens"].copy_(torch.cat([lens, torch.zeros(bucket - real, dtype=torch.int64)]).int())
        slot = tables[torch.arange(real), (lens - 1) // BS].long() * BS + (lens - 1) % BS
        static["slots"].copy_(torch.cat([slot, torch.full((bucket - real,), -1)]))
        static["k"].copy_(torch.randn(bucket, HKV, D, generator=g).to(torch.bfloat16))
        static["v"].copy_(torch.randn(bucket, HKV, D, generator=g).to(torch.bfloat16))
        step["q"].copy_(torch.randn(bucket, HQ, D, generator=g).to(torch.bfloat16))

    new_inputs(100)
    layer()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        layer()
    rows = []
    for seed in (1, 2, 3):
        new_inputs(seed)
        kc0, vc0 = step["k_cache"].clone(), step["v_cache"].clone()
        graph.replay()
        torch.cuda.synchronize()
        replayed = static["out"].clone()
        kc1 = step["k_cache"].clone()
        step["k_cache"].copy_(kc0)
        step["v_cache"].copy_(vc0)
        static["out"].fill_(float("nan"))
        layer()
        torch.cuda.synchronize()
        same = bool(torch.equal(replayed, static["out"]) and torch.equal(kc1, step["k_cache"]))
        ref = reference_paged_attention(
            step["q"], step["k_cache"], step["v_cache"], step["block_tables"], step["seq_lens"],
            step["query_start_loc"], D**-0.5,
        )  # fmt: skip
        err = rel_err(replayed[:real], ref[:real])
        pad_zero = bool((replayed[real:] == 0).all())
        rows.append({"seed": seed, "bitwise_equal": same, "rel_err": err, "padding_rows_zero": pad_zero})
        log.info("cuda graph replay seed %d: bitwise %s rel_err %.2e padding rows zero %s", seed, same, err,
                 pad_zero)  # fmt: skip
    results["cuda_graph"] = rows


def bench_ms(fn: Any) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def graph_of(fn: Any) -> torch.cuda.CUDAGraph:
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


def copy_ceiling(results: dict[str, Any]) -> float:
    src = torch.empty(2 * 1024**3 // 2, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    ms = bench_ms(lambda: dst.copy_(src))
    gbs = 2 * src.numel() * 2 / ms / 1e6
    results["copy_ceiling_GBps"] = gbs
    log.info("device-to-device copy: %.0f GB/s (read + write)", gbs)
    return gbs


def bench_decode(
    results: dict[str, Any], ceiling: float, key: str = "decode", sdpa: bool = True, **kw: Any
) -> list[dict[str, Any]]:
    gen = torch.Generator().manual_seed(2)
    rows = []
    for batch in (1, 4, 16, 64):
        for ctx in (128, 512, 1024, 2048, 4096):
            step = make_step([(1, ctx)] * batch, HQ, HKV, D, torch.bfloat16, "cuda", gen)
            step["max_query_len"] = 1
            out = torch.empty_like(step["q"])
            g = graph_of(lambda step=step, out=out: call(step, out=out, **kw))
            ms = bench_ms(g.replay)
            kv_bytes = batch * ctx * HKV * D * 2 * 2
            ms_sdpa = float("nan")
            if sdpa:
                # SDPA (flash) on a contiguous cache: the G query heads of a KV head as G query rows
                kc = torch.randn(batch, HKV, ctx, D, device="cuda", dtype=torch.bfloat16)
                vc = torch.randn_like(kc)
                qs = step["q"].view(batch, HKV, HQ // HKV, D)
                g2 = graph_of(lambda qs=qs, kc=kc, vc=vc: F.scaled_dot_product_attention(qs, kc, vc))
                ms_sdpa = bench_ms(g2.replay)
                del kc, vc, g2
            row = {
                "batch": batch, "context": ctx, "us": ms * 1e3, "GBps": kv_bytes / ms / 1e6,
                "pct_copy_ceiling": 100 * kv_bytes / ms / 1e6 / ceiling,
                "sdpa_us": ms_sdpa * 1e3, "sdpa_GBps": kv_bytes / ms_sdpa / 1e6,
            }  # fmt: skip
            rows.append(row)
            log.info("decode b=%-3d ctx=%-5d %8.1f us %6.0f GB/s (%3.0f%%) | sdpa %8.1f us %6.0f GB/s",
                     batch, ctx, row["us"], row["GBps"], row["pct_copy_ceiling"], row["sdpa_us"],
                     row["sdpa_GBps"])  # fmt: skip
            del step, g
    results[key] = rows
    return rows


def causal_flops(q_len: int, ctx: int) -> float:
    # QK^T and PV over the visible keys of each query
    visible = q_len * ctx + q_len * (q_len + 1) / 2
    return 4 * HQ * D * visible


def bench_prefill(
    results: dict[str, Any], key: str = "prefill", sdpa: bool = True, **kw: Any
) -> list[dict[str, Any]]:
    gen = torch.Generator().manual_seed(3)
    rows = []
    for n in (512, 1024, 2048, 4096, 8192):
        step = make_step([(n, n)], HQ, HKV, D, torch.bfloat16, "cuda", gen)
        out = torch.empty_like(step["q"])
        ms = bench_ms(lambda step=step, out=out: call(step, out=out, **kw))
        flops = causal_flops(n, 0)
        ms_sdpa = float("nan")
        if sdpa:
            qs = step["q"].transpose(0, 1).unsqueeze(0)  # [1, Hq, n, D]
            kc = torch.randn(1, HQ, n, D, device="cuda", dtype=torch.bfloat16)  # K/V already repeated
            vc = torch.randn_like(kc)
            ms_sdpa = bench_ms(
                lambda qs=qs, kc=kc, vc=vc: F.scaled_dot_product_attention(qs, kc, vc, is_causal=True)
            )
        row = {"tokens": n, "ms": ms, "TFLOPs": flops / ms / 1e9, "sdpa_ms": ms_sdpa,
               "sdpa_TFLOPs": flops / ms_sdpa / 1e9}  # fmt: skip
        rows.append(row)
        log.info("prefill %-5d %8.3f ms %6.1f TFLOP/s | sdpa %8.3f ms %6.1f TFLOP/s", n, ms, row["TFLOPs"],
                 ms_sdpa, row["sdpa_TFLOPs"])  # fmt: skip
    results[key] = rows
    return rows


def bench_mixed(results: dict[str, Any]) -> None:
    gen = torch.Generator().manual_seed(4)
    seqs = [(512, 2048)] + [(1, 1024)] * 32
    step = make_step(seqs, HQ, HKV, D, torch.bfloat16, "cuda", gen)
    out = torch.empty_like(step["q"])
    ms = bench_ms(lambda: call(step, out=out))
    flops = causal_flops(512, 1536) + 32 * 4 * HQ * D * 1024
    results["mixed"] = {"step": "512-token chunk after 1536 cached + 32 decodes at 1024", "ms": ms,
                        "TFLOPs": flops / ms / 1e9}  # fmt: skip
    log.info("mixed step (512 chunk @1536 + 32 decodes @1024): %.3f ms", ms)


def bench_cached_prefix(results: dict[str, Any]) -> None:
    """A short chunk after a long cached prefix (a prefix-cache hit: a chat's next turn), one
    layer, against a decode step over the same context: the chunk reads the same KV."""
    gen = torch.Generator().manual_seed(5)
    rows = []
    for q_len in (8, 32, 128):
        for cached in (1024, 4000):
            step = make_step([(q_len, cached + q_len)], HQ, HKV, D, torch.bfloat16, "cuda", gen)
            out = torch.empty_like(step["q"])
            ms = bench_ms(graph_of(lambda step=step, out=out: call(step, out=out)).replay)
            kv_bytes = (cached + q_len) * HKV * D * 2 * 2
            rows.append({"query": q_len, "cached": cached, "us": ms * 1e3, "GBps": kv_bytes / ms / 1e6})
            log.info("chunk %-4d after %-5d cached %8.1f us %6.0f GB/s of KV", q_len, cached, ms * 1e3,
                     kv_bytes / ms / 1e6)  # fmt: skip
    results["cached_prefix"] = rows


def sweep(results: dict[str, Any], deadline: float) -> None:
    """Time tile/warp/stage variants (and split-K factors) against the defaults; keep the best."""
    gen = torch.Generator().manual_seed(5)
    rows: list[dict[str, Any]] = []
    decode_points = [(1, 4096), (16, 2048), (64, 1024)]
    steps = {}
    for batch, ctx in decode_points:
        steps[(batch, ctx)] = make_step([(1, ctx)] * batch, HQ, HKV, D, torch.bfloat16, "cuda", gen)
        steps[(batch, ctx)]["max_query_len"] = 1
    variants: list[dict[str, Any]] = [{}]
    variants += [{"block_n": bn, "num_warps": w, "num_stages": st}
                 for bn in (32, 64, 128) for w in (4, 8) for st in (2, 3)]  # fmt: skip
    variants += [{"num_splits": n} for n in (1, 2, 4, 8, 16, 32)]
    scores: dict[str, float] = {}
    for var in variants:
        if time.time() > deadline:
            log.info("sweep: out of time, skipping the remaining decode variants")
            break
        rel = []
        for (batch, ctx), step in steps.items():
            try:
                out = torch.empty_like(step["q"])
                g = graph_of(lambda step=step, out=out, var=var: call(step, out=out, **var))
                us = bench_ms(g.replay) * 1e3
            except Exception as exc:  # a variant that does not compile or fit is reported
                us = float("nan")
                log.info("sweep decode %s failed: %s", var, str(exc).splitlines()[0][:200])
            gbps = batch * ctx * HKV * D * 4 / us / 1e3
            rows.append({"kind": "decode", "batch": batch, "context": ctx, **var, "us": us, "GBps": gbps})
            base = next(r["us"] for r in rows if r["kind"] == "decode" and r["batch"] == batch
                        and r["context"] == ctx)  # fmt: skip
            rel.append(us / base)
            log.info("sweep decode b=%-3d ctx=%-5d %-52s %8.1f us %6.0f GB/s", batch, ctx, var, us, gbps)
        if "num_splits" not in var:
            scores[json.dumps(var)] = sum(rel) / len(rel)
    best = min(scores, key=lambda k: 1e9 if math.isnan(scores[k]) else scores[k])
    results["best_decode"] = {"config": json.loads(best), "mean_time_vs_default": scores[best]}
    log.info("sweep: best decode config %s (mean time %.2fx default)", best, scores[best])

    pstep = make_step([(4096, 4096)], HQ, HKV, D, torch.bfloat16, "cuda", gen)
    pvariants: list[dict[str, Any]] = [{}]
    pvariants += [{"block_m": bm, "block_n": bn, "num_warps": w, "num_stages": st}
                  for bm, bn, w in ((64, 64, 4), (128, 64, 8), (128, 128, 8), (64, 32, 4), (128, 32, 8))
                  for st in (2, 3)]  # fmt: skip
    pscores: dict[str, float] = {}
    for var in pvariants:
        if time.time() > deadline:
            log.info("sweep: out of time, skipping the remaining prefill variants")
            break
        try:
            out = torch.empty_like(pstep["q"])
            ms = bench_ms(lambda var=var, out=out: call(pstep, out=out, **var))
        except Exception as exc:
            ms = float("nan")
            log.info("sweep prefill %s failed: %s", var, str(exc).splitlines()[0][:200])
        tf = causal_flops(4096, 0) / ms / 1e9
        rows.append({"kind": "prefill", "tokens": 4096, **var, "ms": ms, "TFLOPs": tf})
        pscores[json.dumps(var)] = 1e9 if math.isnan(ms) else ms
        log.info("sweep prefill 4096 %-62s %8.3f ms %6.1f TFLOP/s", var, ms, tf)
    results["sweep"] = rows
    if pscores:
        pbest = min(pscores, key=lambda k: pscores[k])
        results["best_prefill"] = {"config": json.loads(pbest), "ms_4096": pscores[pbest],
                                   "default_ms_4096": pscores["{}"]}  # fmt: skip
        log.info("sweep: best prefill config %s (%.3f ms vs default %.3f ms)", pbest, pscores[pbest],
                 pscores["{}"])  # fmt: skip


def tuned(results: dict[str, Any], ceiling: float) -> None:
    """Correctness and timings with the configurations the sweep picked."""
    dcfg = results.get("best_decode", {}).get("config", {})
    pcfg = results.get("best_prefill", {}).get("config", {})
    gen = torch.Generator().manual_seed(6)
    rows = []
    cases = [
        ("decode b16", [(1, int(x)) for x in torch.randint(1, 3000, (16,), generator=gen)], dcfg),
        ("prefill 2x333", [(333, 333), (257, 257)], pcfg),
        ("mixed", [(300, 1000), (1, 2048), (1, 17), (64, 64), (1, 700), (5, 5)], pcfg),
    ]
    for name, seqs, cfg in cases:
        step = make_step(seqs, HQ, HKV, D, torch.bfloat16, "cuda", gen)
        out = torch.full_like(step["q"], float("nan"))
        call(step, out=out, **cfg)
        ref = reference_paged_attention(
            step["q"], step["k_cache"], step["v_cache"], step["block_tables"], step["seq_lens"],
            step["query_start_loc"], D**-0.5,
        )  # fmt: skip
        err = rel_err(out, ref)
        rows.append({"case": f"tuned {name} {cfg}", "rel_err": err, "tol": TOL[torch.bfloat16],
                     "ok": err <= TOL[torch.bfloat16]})  # fmt: skip
        log.info("correctness tuned %-14s %s rel_err %.2e", name, cfg, err)
    results.setdefault("correctness", []).extend(rows)
    if dcfg:
        bench_decode(results, ceiling, key="decode_tuned", sdpa=False, **dcfg)
    if pcfg:
        bench_prefill(results, key="prefill_tuned", sdpa=False, **pcfg)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", action="store_true", help="also time kernel variants")
    parser.add_argument("--skip-timing", action="store_true")
    parser.add_argument("--cached-prefix", action="store_true", help="time only chunks after a cached prefix")
    parser.add_argument("--budget-s", type=float, default=270.0, help="stop sweeping past this time")
    args = parser.parse_args(argv)
    out_dir = os.environ.get("OUT")
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stdout)]
    if out_dir:
        handlers.append(logging.FileHandler(os.path.join(out_dir, "paged_attention_bench.log")))
    logging.basicConfig(level=logging.INFO, format="%(message)s", handlers=handlers, force=True)
    if not torch.cuda.is_available():
        log.error("CUDA is not available")
        return 2
    import triton

    results: dict[str, Any] = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "errors": [],
    }
    log.info("%s, torch %s, triton %s", results["device"], results["torch"], results["triton"])
    t0 = time.time()
    sections: list[tuple[str, Callable[[], object]]] = [("correctness", lambda: check_correctness(results)),
                ("cuda_graph", lambda: check_cuda_graph(results))]  # fmt: skip
    ceiling = [float("nan")]
    if args.cached_prefix:
        sections = [("cached_prefix", lambda: bench_cached_prefix(results))]
    elif not args.skip_timing:
        sections += [
            ("copy_ceiling", lambda: ceiling.__setitem__(0, copy_ceiling(results))),
            ("decode", lambda: bench_decode(results, ceiling[0])),
            ("prefill", lambda: bench_prefill(results)),
            ("mixed", lambda: bench_mixed(results)),
            ("cached_prefix", lambda: bench_cached_prefix(results)),
        ]
    if args.sweep and not args.skip_timing:
        sections.append(("sweep", lambda: sweep(results, t0 + args.budget_s - 70)))
        sections.append(("tuned", lambda: tuned(results, ceiling[0])))
    for name, fn in sections:
        try:
            fn()
        except Exception:
            log.error("section %s failed:\n%s", name, traceback.format_exc())
            results["errors"].append({"section": name, "error": traceback.format_exc()[-2000:]})
        log.info("[%s done at %.0f s]", name, time.time() - t0)
        if out_dir:  # after every section: a run cut short still leaves its numbers
            with open(os.path.join(out_dir, "paged_attention_bench.json"), "w") as f:
                json.dump(results, f, indent=1, default=str)
    print_summary(results)
    failed = [r for r in results.get("correctness", []) if not r["ok"]]
    failed += [r for r in results.get("cuda_graph", []) if not r["bitwise_equal"]]
    return 1 if failed or results["errors"] else 0


def print_summary(results: dict[str, Any]) -> None:
    lines = [
        f"== paged attention on {results['device']} (torch {results['torch']}, triton {results['triton']})"
    ]
    corr = results.get("correctness", [])
    bad = [r["case"] for r in corr if not r["ok"]]
    lines.append(f"correctness: {len(corr) - len(bad)}/{len(corr)} ok" + (f", FAILED {bad}" if bad else ""))
    graph = results.get("cuda_graph", [])
    if graph:
        lines.append(
            "cuda graph replay == eager bitwise: "
            + str(all(r["bitwise_equal"] for r in graph))
            + f", max rel_err {max(r['rel_err'] for r in graph):.1e}"
        )
    if "copy_ceiling_GBps" in results:
        lines.append(f"copy ceiling {results['copy_ceiling_GBps']:.0f} GB/s")
    for name in ("best_decode", "best_prefill"):
        if name in results:
            lines.append(f"{name}: {results[name]}")
    dec = results.get("decode", [])
    tuned_us = {(r["batch"], r["context"]): r["us"] for r in results.get("decode_tuned", [])}
    tuned_ms = {r["tokens"]: r["ms"] for r in results.get("prefill_tuned", [])}
    if dec:
        lines.append("decode (graph replay)  batch ctx   us    GB/s  %ceil | sdpa us  GB/s | tuned us")
        for r in dec:
            lines.append(
                f"  {r['batch']:>20} {r['context']:>5} {r['us']:7.1f} {r['GBps']:6.0f} "
                f"{r['pct_copy_ceiling']:4.0f}% | {r['sdpa_us']:7.1f} {r['sdpa_GBps']:5.0f} | "
                f"{tuned_us.get((r['batch'], r['context']), float('nan')):7.1f}"
            )
    pre = results.get("prefill", [])
    if pre:
        lines.append("prefill tokens    ms   TFLOP/s | sdpa ms TFLOP/s | tuned ms")
        for r in pre:
            tuned_val = tuned_ms.get(r["tokens"], float("nan"))
            lines.append(f"  {r['tokens']:>12} {r['ms']:7.3f} {r['TFLOPs']:6.1f} | {r['sdpa_ms']:7.3f} "
                         f"{r['sdpa_TFLOPs']:6.1f} | {tuned_val:7.3f}")  # fmt: skip
    if "mixed" in results:
        lines.append(f"mixed: {results['mixed']['step']}: {results['mixed']['ms']:.3f} ms")
    if results["errors"]:
        lines.append("errors in sections: " + ", ".join(e["section"] for e in results["errors"]))
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    sys.exit(main())
