"""Run a bench: build the engine (or reach the endpoint), run every case, return the report dict."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import math
import platform
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from multilora_studio.bench.adapter_pool import adapter_name, make_adapter_pool
from multilora_studio.bench.cases import BenchOptions, Case, build_cases, case_rng
from multilora_studio.bench.ceiling import Ceiling, adapter_bytes, copy_bandwidth, step_weight_bytes
from multilora_studio.bench.drive import Backend, run_requests
from multilora_studio.bench.engine_backend import EngineBackend
from multilora_studio.bench.latency import run_latency
from multilora_studio.bench.stack_sampler import StackSampler, explain_slow_steps
from multilora_studio.bench.stats import summarize
from multilora_studio.bench.tiers import tier_stats
from multilora_studio.bench.workloads import BenchRequest, prompt_token_ids
from multilora_studio.engine import Engine, EngineConfig, resolve_device, resolve_dtype
from multilora_studio.engine.config import usable_cores
from multilora_studio.engine.step.step_trace import summarize as summarize_steps
from multilora_studio.util import extra_install_hint

log = logging.getLogger(__name__)
WARMUP_TOKENS = 2


def run_bench(options: BenchOptions, checkpoint: Callable[[dict], None] | None = None) -> dict[str, Any]:
    """Run every case of ``options``; the report (see docs/bench.md) as a JSON-ready dict.

    ``checkpoint`` gets the report once the engine's cases are done, before the baseline.
    """
    report: dict[str, Any] = {"options": _jsonable(vars(options)), "environment": _environment()}
    if options.endpoint:
        report["cases"] = _run_endpoint(options, report)
        return report
    with contextlib.ExitStack() as stack:
        workdir = options.adapter_dir
        if workdir is None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="mls-bench-")))
        cases, pool = _run_in_process(options, report, workdir)
        if options.baseline == "peft":
            if checkpoint is not None:
                checkpoint(report)
            report["baseline"] = _run_peft(options, report, cases, pool)
    return report


# ---------------------------------------------------------------- in-process


def engine_config(options: BenchOptions) -> EngineConfig:
    input_high, output_high = options.input_len[1], options.output_len[1]
    seqs = options.seqs
    max_loras, model_len, batched = options.max_loras, max(16, input_high + output_high + 16), 2048
    sizes = options.latency_sizes(resolve_device(options.device).type)
    if sizes is not None:  # every row of the distinct-adapter batch in a slot; the long prompt in one step
        seqs = max(seqs, sizes.batch, sizes.prefill_prompts)
        max_loras = max(max_loras, sizes.adapters)
        model_len = max(model_len, sizes.longest + 16)
        batched = max(batched, sizes.ttft_prompt)
    return EngineConfig(
        model=options.model,
        device=options.device,
        dtype=options.dtype,
        max_loras=max_loras,
        max_lora_rank=options.rank,
        max_cpu_loras=options.max_cpu_loras,
        adapter_load_workers=options.load_workers,
        adapter_loader=options.adapter_loader,
        max_num_seqs=seqs,
        max_model_len=model_len,
        max_num_batched_tokens=max(batched, seqs, min(seqs * input_high, 8192)),
        kv_cache_memory_gb=options.kv_cache_gb,
        seed=options.seed,
    )


def _run_in_process(
    options: BenchOptions, report: dict[str, Any], workdir: Path
) -> tuple[list[Case], dict[str, Path]]:
    """Cases and adapter folders of the run; fills ``report`` with the engine's side."""
    config = engine_config(options)
    device = resolve_device(config.device)
    dtype = resolve_dtype(config.dtype, device)
    if options.bandwidth_gbps is not None:
        bandwidth = (options.bandwidth_gbps * 1e9, "given")
    else:  # measured before the engine sizes its KV cache from the free memory
        bandwidth = (copy_bandwidth(device, (2 << 30) if device.type == "cuda" else (256 << 20)), "measured")
    started = time.perf_counter()
    with Engine(config) as engine:
        info: dict[str, Any] = {
            "model": engine.model_name,
            "device": str(engine.device),
            "dtype": str(engine.dtype).removeprefix("torch."),
            "startup_s": time.perf_counter() - started,
            "cpu_threads": engine.cpu_threads,
            "startup_phases_s": dict(engine.runner.startup_seconds),
        }
        report["engine"] = info
        spec = engine.spec
        ceiling = Ceiling(
            step_weight_bytes(spec, dtype),
            adapter_bytes(spec, options.rank, options.targets, dtype),
            *bandwidth,
        )
        report["ceiling"] = _ceiling_report(ceiling, options)
        cases = build_cases(options, spec.vocab_size)
        sizes = options.latency_sizes(device.type)
        count = max([c.pool_size for c in cases] + [1, sizes.adapters if sizes else 0])
        started = time.perf_counter()
        pool = make_adapter_pool(
            spec, workdir, count, options.distinct_weights, options.rank, options.targets, dtype, options.seed
        )
        info["adapters_written_s"] = time.perf_counter() - started
        started = time.perf_counter()
        for name, folder in pool.items():
            engine.add_adapter(name, folder, preload=False)
        info["adapters_registered_s"] = time.perf_counter() - started
        names = [adapter_name(i) for i in range(count)]
        if sizes is not None:
            rng = case_rng(options.seed, "latency")
            report["latency"] = run_latency(engine, names, sizes, options.latency_rounds, rng)
        backend = EngineBackend(engine)
        report["cases"] = (
            asyncio.run(_run_cases(backend, cases, names, options, engine, ceiling)) if cases else []
        )
    return cases, pool


def _ceiling_report(ceiling: Ceiling, options: BenchOptions) -> dict[str, Any]:
    return {
        "weight_bytes_per_step": ceiling.base_bytes,
        "adapter_bytes": ceiling.adapter_bytes,
        "bandwidth_GBps": ceiling.bandwidth_bytes_s / 1e9 if ceiling.bandwidth_bytes_s else None,
        "bandwidth_source": ceiling.bandwidth_source,
        "batch": options.batch,
        "base_tok_s": ceiling.tokens_per_second(options.batch),
        "distinct_tok_s": ceiling.tokens_per_second(options.batch, options.batch),
    }


# ---------------------------------------------------------------- endpoint


def _run_endpoint(options: BenchOptions, report: dict[str, Any]) -> list[dict[str, Any]]:
    try:
        from multilora_studio.bench.http_backend import EndpointBackend, served_models
    except ImportError:
        raise ValueError(f"--endpoint needs httpx: {extra_install_hint('bench')}") from None

    assert options.endpoint is not None
    url = options.endpoint.rstrip("/")
    served = served_models(url, options.api_key)
    report["engine"] = {"endpoint": url, "model": served.base, "adapters_served": len(served.adapters)}
    cases = build_cases(options)
    needed = max([c.pool_size for c in cases] + [0])
    if needed > len(served.adapters):
        raise ValueError(
            f"the workloads need {needed} adapters but {url} serves {len(served.adapters)}; "
            "load more adapters on the server or lower --batch / --num-adapters / --sweep-adapters"
        )

    async def run() -> list[dict[str, Any]]:
        backend = EndpointBackend(url, served.base, options.api_key)
        try:
            return await _run_cases(backend, cases, list(served.adapters), options, None, None)
        finally:
            await backend.aclose()

    return asyncio.run(run())


# ---------------------------------------------------------------- cases


async def _run_cases(
    backend: Backend,
    cases: Sequence[Case],
    names: Sequence[str],
    options: BenchOptions,
    engine: Engine | None,
    ceiling: Ceiling | None,
) -> list[dict[str, Any]]:
    if options.warmup:
        await _warmup(backend, options, names if any(c.pool_size for c in cases) else [])
    results = []
    for case in cases:
        if options.warmup and case.kind == "pattern":
            await _warm_adapters(backend, case, names, options)
        prefetched = 0
        if options.prefetch_host and engine is not None and case.kind != "pattern":
            prefetched = _prefetch_host(engine, case, names)
        before = engine.metrics(fresh=True) if engine is not None else None
        steps_since = time.perf_counter()
        sampler = StackSampler() if options.sample_stacks and engine is not None else None
        if sampler is not None:
            sampler.start()
        mapped = [None if r.adapter is None else names[r.adapter] for r in case.requests]
        with tqdm(total=len(case.requests), desc=case.name, leave=False, disable=not options.progress) as bar:
            outcome, started = await run_requests(backend, case.requests, case.prompts, mapped, bar)
        summary = summarize(outcome, started, options.slo)
        if case.kind != "pattern":
            summary["decode_tok_s"] = None
        record: dict[str, Any] = {
            "name": case.name,
            "kind": case.kind,
            **case.params,
            "distinct_adapters": case.distinct_adapters,
            "prefetched_to_host": prefetched,
            **summary,
            "ttft_samples_ms": sorted(round(r.ttft * 1e3, 3) for r in outcome if r.ok and r.ttft),
        }
        after = engine.metrics(fresh=True) if engine is not None else None
        if engine is not None and before is not None and after is not None:
            adapter_requests = sum(r.adapter is not None for r in case.requests)
            record["engine"] = tier_stats(before, after, adapter_requests, engine.device)
            # batch occupancy and step times of the case (graph decode vs eager steps)
            steps = engine.step_trace.snapshot(since=steps_since)
            record["engine"]["steps"] = summarize_steps(steps)
            if sampler is not None:
                sampler.stop()
                print(f"{case.name}:")
                record["slow_steps"] = explain_slow_steps(steps, sampler, count=3)
        if ceiling is not None and case.kind == "pattern":
            record["ceiling_tok_s"] = ceiling.tokens_per_second(len(case.requests), case.distinct_adapters)
        if summary["errors"]:
            log.warning("%s: %d requests failed: %s", case.name, summary["errors"], summary["first_error"])
        results.append(record)
    return results


def _prefetch_host(engine: Engine, case: Case, names: Sequence[str]) -> int:
    """Read the case's most popular adapters into host RAM before it runs, as many as the
    host tier holds (S-LoRA measures with every adapter in host memory); returns how many."""
    snapshot = engine.metrics(fresh=True)
    count = min(case.pool_size, snapshot.cpu_capacity if snapshot is not None else 0)
    wanted = [names[k] for k in reversed(range(count))]  # the most popular loaded last: kept longest
    failed = {name: error for name, error in engine.prefetch_adapters(wanted).items() if error}
    if failed:
        raise RuntimeError(f"prefetching adapters for {case.name} failed: {next(iter(failed.values()))}")
    return count


async def _warmup(backend: Backend, options: BenchOptions, names: Sequence[str]) -> None:
    """One unmeasured batch (base and the first adapter) so compilation is not measured."""
    size = min(options.batch, options.seqs)
    adapters = [names[0] if names and i % 2 else None for i in range(size)]
    requests = [BenchRequest(0.0, None, options.input_len[1], WARMUP_TOKENS) for _ in range(size)]
    await _run_unmeasured(backend, requests, adapters, options.seed, "the warm-up")


async def _warm_adapters(backend: Backend, case: Case, names: Sequence[str], options: BenchOptions) -> None:
    """One unmeasured 1-token request per adapter of a batch pattern, so the measured batch
    runs on resident adapters (Punica's and S-LoRA's batch measurements are steady-state);
    cold loads are measured by the online and sweep cases."""
    adapters = sorted({r.adapter for r in case.requests if r.adapter is not None})
    if adapters:
        requests = [BenchRequest(0.0, a, min(8, options.input_len[0]), 1) for a in adapters]
        mapped = [names[a] for a in adapters]
        what = f"the adapter warm-up of {case.name}"
        await _run_unmeasured(backend, requests, mapped, options.seed + 1, what)


async def _run_unmeasured(
    backend: Backend, requests: list[BenchRequest], adapters: Sequence[str | None], seed: int, what: str
) -> None:
    prompt_rng = np.random.default_rng(seed)
    prompts = [prompt_token_ids(r.input_len, prompt_rng) for r in requests]
    outcome, _ = await run_requests(backend, requests, prompts, list(adapters))
    failed = [r.error for r in outcome if r.error]
    if failed:
        raise RuntimeError(f"{what} requests failed: {failed[0]}")


# ---------------------------------------------------------------- PEFT baseline


def _run_peft(
    options: BenchOptions, report: dict[str, Any], cases: Sequence[Case], pool: dict[str, Path]
) -> dict[str, Any]:
    """The pattern cases again through HF + PEFT, after the engine has freed the device."""
    from multilora_studio.bench.peft_baseline import PeftBaseline

    patterns = [c for c in cases if c.kind == "pattern" and c.params["pattern"] in options.baseline_patterns]
    gc.collect()
    device = resolve_device(options.device)
    dtype = resolve_dtype(options.dtype, device)
    started = time.perf_counter()
    baseline = PeftBaseline(options.model, dtype, device)
    try:
        needed = max(c.pool_size for c in patterns)
        baseline.load_adapters({adapter_name(i): pool[adapter_name(i)] for i in range(needed)})
        results: dict[str, Any] = {"setup_s": time.perf_counter() - started, "cases": []}
        engine_rates = {c["name"]: c["output_tok_s"] for c in report["cases"]}
        for index, case in enumerate(patterns):
            adapters = [None if r.adapter is None else adapter_name(r.adapter) for r in case.requests]
            lengths = [options.baseline_output_len or r.output_len for r in case.requests]
            if index == 0:
                baseline.run_batch(case.prompts, adapters, [WARMUP_TOKENS] * len(lengths))
            with tqdm(total=1, desc=f"PEFT {case.name}", leave=False, disable=not options.progress) as bar:
                measured: dict[str, Any] = {
                    "name": case.name,
                    **baseline.run_batch(case.prompts, adapters, lengths),
                }
                bar.update(1)
            engine_rate = engine_rates[case.name]
            measured["engine_over_peft"] = engine_rate / measured["output_tok_s"] if engine_rate else None
            results["cases"].append(measured)
        return results
    finally:
        baseline.close()


# ---------------------------------------------------------------- helpers


def _environment() -> dict[str, Any]:
    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cores": usable_cores(),
        "machine": platform.machine(),
    }
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name()
    return env


def _jsonable(values: dict[str, Any]) -> dict[str, Any]:
    """Options as JSON values: paths as text, nested dataclasses as dicts, inf as "inf", no keys."""
    return {key: _json_value(key, value) for key, value in values.items()}


def _json_value(key: str, value: Any) -> Any:
    if key == "api_key" and value:
        return "***"
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "__dataclass_fields__"):
        return _jsonable(vars(value))
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    return value
