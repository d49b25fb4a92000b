"""The report of a bench run as a text table and as JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from multilora_studio.bench.latency import render_latency

COLUMNS = (
    ("case", "<"),
    ("req", ">"),
    ("out tok/s", ">"),
    ("req/s", ">"),
    ("TTFT ms p50/p90/p99", ">"),
    ("TPOT ms p50/p90/p99", ">"),
    ("SLO", ">"),
    ("GPU hit", ">"),
    ("CPU hit", ">"),
    ("cold", ">"),
    ("GPU GB", ">"),
)


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def _triple(values: dict[str, float | None]) -> str:
    return "/".join(
        _num(values.get(k), 0 if (values.get(k) or 0) >= 100 else 1) for k in ("p50", "p90", "p99")
    )


def case_row(case: dict[str, Any]) -> list[str]:
    engine = case.get("engine") or {}
    memory = engine.get("peak_device_memory_bytes") or engine.get("device_memory_bytes")
    done = f"{case['completed']}" if not case["errors"] else f"{case['completed']}/{case['requests']}"
    return [
        case["name"],
        done,
        _num(case["output_tok_s"]),
        _num(case["requests_s"], 2),
        _triple(case["ttft_ms"]),
        _triple(case["tpot_ms"]),
        _pct(case["slo_attainment"]["both"]),
        _pct(engine.get("gpu_hit_rate")),
        _pct(engine.get("cpu_hit_rate")),
        str(engine["cold_loads"]) if "cold_loads" in engine else "-",
        _num(memory / 1e9, 2) if memory else "-",
    ]


def render_table(rows: list[list[str]]) -> str:
    headers = [name for name, _ in COLUMNS]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    lines = ["  ".join(f"{h:{a}{w}}" for (h, a), w in zip(COLUMNS, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    for row in rows:
        lines.append("  ".join(f"{c:{a}{w}}" for c, (_, a), w in zip(row, COLUMNS, widths, strict=True)))
    return "\n".join(line.rstrip() for line in lines)


def render(report: dict[str, Any]) -> str:
    """Header lines (setup, ceiling), the table of cases, then the baseline ratios."""
    engine = report.get("engine", {})
    options = report["options"]
    lines = []
    if "endpoint" in engine:
        lines.append(
            f"endpoint {engine['endpoint']}: {engine['model']}, {engine['adapters_served']} adapters"
        )
    else:
        lines.append(
            f"model {engine.get('model')} on {engine.get('device')} ({engine.get('dtype')}); adapters rank "
            f"{options['rank']} on {len(options['targets'])} projections; {options['max_loras']} GPU slots; "
            f"max {options['max_num_seqs'] or options['batch']} running"
        )
    ceiling = report.get("ceiling")
    if ceiling:
        bandwidth = ceiling["bandwidth_GBps"]
        lines.append(
            f"weights per decode step {ceiling['weight_bytes_per_step'] / 1e9:.3f} GB "
            f"(+{ceiling['adapter_bytes'] / 1e6:.1f} MB per distinct adapter); bandwidth "
            f"{_num(bandwidth)} GB/s ({ceiling['bandwidth_source']}); ceiling at batch {ceiling['batch']}: "
            f"base {_num(ceiling['base_tok_s'], 0)} tok/s, {ceiling['batch']} distinct adapters "
            f"{_num(ceiling['distinct_tok_s'], 0)} tok/s"
        )
    slo = options["slo"]
    targets = [f"TTFT <= {slo['ttft_s'] * 1e3:g} ms" if slo["ttft_s"] else "", ""]
    targets[1] = f"TPOT <= {slo['tpot_s'] * 1e3:g} ms" if slo["tpot_s"] else ""
    lines.append(f"SLO: {' and '.join(t for t in targets if t) or 'none'}")
    if report.get("latency"):
        lines.append("")
        lines.extend(render_latency(report["latency"]))
    if report["cases"]:
        lines.append("")
        lines.append(render_table([case_row(c) for c in report["cases"]]))
    for case in report["cases"]:
        compiles = (case.get("engine") or {}).get("kernel_compiles")
        if compiles:
            seconds = case["engine"].get("kernel_compile_s", 0.0)
            lines.append(
                f"note: {case['name']}: {compiles} kernel compiles ({seconds:.1f} s) stalled the batch"
            )
    baseline = report.get("baseline")
    if baseline:
        lines.append("")
        lines.append(
            f"HF transformers + PEFT (adapter_names=), same batches (setup {baseline['setup_s']:.1f} s):"
        )
        for case in baseline["cases"]:
            lines.append(
                f"  {case['name']:<16} PEFT {case['output_tok_s']:10.1f} tok/s   engine / PEFT = "
                f"{_num(case['engine_over_peft'], 2)}x"
            )
    return "\n".join(lines)


def write_json(report: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, default=str))
