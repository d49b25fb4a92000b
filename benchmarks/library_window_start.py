"""The window's engine start over a large library: from ``EngineHost.start`` until ready, and
the part of it that registers the library's adapters.

    QT_QPA_PLATFORM=offscreen python -m benchmarks.library_window_start --home DIR [--json PATH]

The library under ``--home`` (``benchmarks.library_scale`` builds one) is served by the
embedded model on the CPU, offscreen, without the demo adapters.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import QEventLoop
from PySide6.QtWidgets import QApplication

from multilora_studio.adapters.registry import Registry
from multilora_studio.gui.engine_host import EngineHost
from multilora_studio.gui.preferences import EngineChoice

LIBRARY_STEP = "registering the library's adapters"  # EngineHost's progress message


def run(home: Path) -> dict[str, float | int | str]:
    app = QApplication.instance() or QApplication(sys.argv[:1])
    host = EngineHost(Registry(home), demo_adapters=False)
    marks: dict[str, float] = {}
    outcome: list[str] = []
    loop = QEventLoop()

    def progressed(fraction: float, message: str) -> None:
        if message == LIBRARY_STEP:
            marks.setdefault("library", time.perf_counter())

    def finished(result: str) -> None:
        outcome.append(result)
        loop.quit()

    host.progress.connect(progressed)
    host.ready.connect(lambda: finished("ready"))
    host.failed.connect(finished)
    began = time.perf_counter()
    host.start(EngineChoice(device="cpu"))
    loop.exec()
    ended = time.perf_counter()
    app.processEvents()
    result: dict[str, float | int | str] = {
        "outcome": outcome[0],
        "start_s": ended - began,
        "library_s": ended - marks.get("library", ended),
        "adapters_skipped": len(host.skipped),
    }
    host.shutdown()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", type=Path, required=True, help="the library's folder")
    parser.add_argument("--json", type=Path, default=None, help="write the results here too")
    args = parser.parse_args()
    results = run(args.home)
    print(json.dumps(results, indent=1))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
