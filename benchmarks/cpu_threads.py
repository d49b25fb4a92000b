"""Single-stream decode and the window's event-loop stalls on a busy CPU, by the engine's CPU threads.

    python -m benchmarks.cpu_threads [--threads 1,2,auto] [--competitors 1] [--rounds 3] [--json PATH]

Each setting runs in its own process (OpenMP's pools are per process) while ``--competitors``
CPU-bound processes (pure Python loops) run beside it: the embedded model on the CPU, float32,
a 32-token prompt and 64 greedy tokens, median of ``--rounds`` after a warm-up; then the
window's smoke test (one compare of base + the demo adapters, offscreen) with the largest
event-loop stall it saw. ``auto`` is EngineConfig's default (one less than the usable cores).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

DECODE = """
import json, sys, time
from multilora_studio.engine import Engine, EngineConfig, SamplingParams
threads = None if sys.argv[1] == "auto" else int(sys.argv[1])
rounds = int(sys.argv[2])
with Engine(EngineConfig(device="cpu", dtype="float32", cpu_threads=threads)) as engine:
    prompt = engine.tokenizer.encode("Tell me about the history of the printing press in Europe.")[:32]
    params = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)
    engine.generate([prompt], [None], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
    rates = []
    for _ in range(rounds):
        out = engine.generate([prompt], [None], params)[0]
        rates.append((len(out.token_ids) - 1) / (out.finish_time - out.first_token_time))
    print(json.dumps({"rates": rates, "threads": engine.config.cpu_threads_for("cpu")}))
"""

SMOKE = """
import sys
from multilora_studio.gui.smoke import run_smoke_test
sys.exit(run_smoke_test(device="cpu", cpu_threads=0 if sys.argv[1] == "auto" else int(sys.argv[1])))
"""


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--threads", default="1,2,auto")
    parser.add_argument("--competitors", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-gui", action="store_true", help="decode only")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    settings = [s.strip() for s in args.threads.split(",") if s.strip()]
    env = {**os.environ, "QT_QPA_PLATFORM": os.environ.get("QT_QPA_PLATFORM", "offscreen")}
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
        env.pop(name, None)  # the engine's setting alone decides
    competitors = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.competitors)
    ]
    results: dict = {"cores": len(os.sched_getaffinity(0)), "competitors": args.competitors, "settings": {}}
    try:
        for setting in settings:
            done = subprocess.run(
                [sys.executable, "-c", DECODE, setting, str(args.rounds)],
                env=env, capture_output=True, text=True, check=True,
            )  # fmt: skip
            decode = json.loads(done.stdout.strip().splitlines()[-1])
            row = {"threads": decode["threads"], "decode_tok_s": statistics.median(decode["rates"])}
            row["rounds"] = decode["rates"]
            if not args.no_gui:
                smoke = subprocess.run(
                    [sys.executable, "-c", SMOKE, setting], env=env, capture_output=True, text=True
                )
                stall = re.search(r"max stall ([\d.]+) ms", smoke.stdout)
                row["gui_max_stall_ms"] = float(stall.group(1)) if stall else None
                row["smoke_exit"] = smoke.returncode
            results["settings"][setting] = row
            print(setting, json.dumps(row), flush=True)
    finally:
        for process in competitors:
            process.kill()
    best = max(row["decode_tok_s"] for row in results["settings"].values())
    for setting, row in results["settings"].items():
        print(
            f"  {setting:>5}: {row['decode_tok_s']:.2f} tok/s ({row['decode_tok_s'] / best:.2f} of best)"
            + (f", GUI max stall {row['gui_max_stall_ms']} ms" if "gui_max_stall_ms" in row else "")
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
