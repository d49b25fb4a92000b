"""PNG charts of a bench report (matplotlib, the optional ``bench`` extra)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from multilora_studio.util import extra_install_hint

log = logging.getLogger(__name__)
INSTALL_HINT = f"--plot needs matplotlib: {extra_install_hint('bench')}"


def require_matplotlib() -> None:
    """ValueError with the install command when matplotlib is missing (checked before a long run)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ValueError(INSTALL_HINT) from None


def write_plots(report: dict[str, Any], folder: Path) -> list[Path]:
    """Throughput vs number of adapters (sweep cases), TTFT CDFs per pattern and per rate."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    folder.mkdir(parents=True, exist_ok=True)
    cases = report["cases"]
    written = []
    sweep = [c for c in cases if c["kind"] == "sweep" and c["output_tok_s"]]
    if sweep:
        written.append(_throughput_vs_adapters(sweep, folder / "throughput_vs_adapters.png"))
    for kind, title in (("pattern", "popularity pattern"), ("online", "online rate")):
        chosen = [c for c in cases if c["kind"] == kind and c["ttft_samples_ms"]]
        if chosen:
            written.append(_ttft_cdf(chosen, f"TTFT CDF per {title}", folder / f"ttft_cdf_{kind}.png"))
    for path in written:
        log.info("wrote %s", path)
    return written


def _throughput_vs_adapters(cases: list[dict[str, Any]], path: Path) -> Path:
    import matplotlib.pyplot as plt

    cases = sorted(cases, key=lambda c: c["num_adapters"])
    figure, axes = plt.subplots(figsize=(6, 4))
    counts = [c["num_adapters"] for c in cases]
    axes.plot(counts, [c["output_tok_s"] for c in cases], marker="o")
    axes.set_xscale("log")
    axes.set_xticks(counts, [str(n) for n in counts])
    axes.set_ylim(bottom=0)
    axes.set_xlabel("number of adapters")
    axes.set_ylabel("output tokens/s")
    axes.set_title("Throughput vs number of adapters")
    axes.grid(True, alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def _ttft_cdf(cases: list[dict[str, Any]], title: str, path: Path) -> Path:
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6, 4))
    for case in cases:
        samples = case["ttft_samples_ms"]
        fractions = [(i + 1) / len(samples) for i in range(len(samples))]
        axes.step(samples, fractions, where="post", label=case["name"])
    axes.set_xlabel("time to first token (ms)")
    axes.set_ylabel("fraction of requests")
    axes.set_ylim(0, 1.02)
    axes.set_title(title)
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path
