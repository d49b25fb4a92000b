"""Train the demo adapters: ``python -m multilora_studio.demo.train_demo_adapters``.

Self-distillation on the embedded model: the base model answers the template prompts
(greedy, batched, through the engine); each style rewrites the answers by its rule; PEFT
trains one LoRA per style on them; the engine then measures every adapter against the
base on held-out prompts; folders, model cards and ``index.json`` are written to --out.
"""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from multilora_studio.demo import INDEX_FILE
from multilora_studio.demo.card import CardFacts, write_card
from multilora_studio.demo.data import base_answers, build_examples, shorten
from multilora_studio.demo.evaluation import evaluate
from multilora_studio.demo.prompts import held_out_prompts, training_prompts
from multilora_studio.demo.styles import STYLES, STYLES_BY_NAME
from multilora_studio.demo.training import WEIGHTS_FILE, TrainSettings, train_adapter
from multilora_studio.engine import Engine, EngineConfig
from multilora_studio.engine.model.model_source import describe_model
from multilora_studio.paths import data_dir

log = logging.getLogger(__name__)

HUB_BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"
ANSWER_TOKENS = 64  # base answers are generated this long, then cut to whole sentences
EVAL_TOKENS = 96


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    defaults = TrainSettings()
    parser = argparse.ArgumentParser(prog="python -m multilora_studio.demo.train_demo_adapters")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: the shipped one)")
    parser.add_argument("--only", nargs="*", choices=sorted(STYLES_BY_NAME), help="train only these")
    parser.add_argument("--steps", type=int, default=defaults.steps)
    parser.add_argument("--batch-size", type=int, default=defaults.batch_size)
    parser.add_argument("--learning-rate", type=float, default=defaults.learning_rate)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--max-prompts", type=int, default=None, help="use the first N prompts (quick tries)")
    parser.add_argument("--device", default="cpu", help="cpu (the documented run) or cuda")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from multilora_studio.demo import demo_adapters_root

    out: Path = args.out or demo_adapters_root()
    styles = [STYLES_BY_NAME[name] for name in args.only] if args.only else list(STYLES)
    settings = replace(
        TrainSettings(),
        steps=args.steps,
        batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        seed=args.seed,
    )
    base = describe_model(None)
    prompts = training_prompts()[: args.max_prompts]
    config = EngineConfig(
        model=str(base.folder),
        device=args.device,
        dtype="float32",
        max_num_seqs=128,
        max_model_len=512,
        max_num_batched_tokens=4096,
        max_loras=len(STYLES),
        max_lora_rank=16,
        seed=args.seed,
    )
    with Engine(config) as engine:
        start = time.perf_counter()
        cache = data_dir() / "demo_training" / f"base_answers-{base.digest[:16]}-{ANSWER_TOKENS}.json"
        answers = [shorten(text) for text in base_answers(engine, prompts, ANSWER_TOKENS, cache)]
        log.info(
            "%d base answers in %.0f s (%d usable)",
            len(prompts),
            time.perf_counter() - start,
            sum(a is not None for a in answers),
        )
        results = {}
        for style in styles:
            examples = build_examples(engine.tokenizer, prompts, answers, style.rewrite, settings.max_len)
            results[style.name] = train_adapter(
                base.folder, style, examples, settings, out / style.name, HUB_BASE, args.device
            )
            log.info("%s trained in %.0f s", style.name, results[style.name].seconds)
            engine.add_adapter(style.name, out / style.name)
        evaluations = evaluate(engine, styles, held_out_prompts(), EVAL_TOKENS)
    command = "python -m multilora_studio.demo.train_demo_adapters " + shlex.join(
        sys.argv[1:] if argv is None else argv
    )
    for style in styles:
        facts = CardFacts(
            base_name=base.name,
            base_hub_id=HUB_BASE,
            base_digest=base.digest,
            prompts=len(prompts),
            command=command.strip(),
            device=args.device,
            threads=torch.get_num_threads(),
            size_bytes=(out / style.name / WEIGHTS_FILE).stat().st_size,
        )
        write_card(out / style.name, style, settings, results[style.name], evaluations[style.name], facts)
        evaluation = evaluations[style.name]
        log.info(
            "%s: behaviour in %.0f%% of held-out answers (base %.0f%%)",
            style.name,
            100 * evaluation.rate,
            100 * evaluation.base_rate,
        )
    write_index(out, base.name, base.digest, styles, evaluations, results)
    return 0


def write_index(out: Path, base_name: str, digest: str, styles, evaluations, results) -> None:
    """Update ``index.json`` with the adapters trained now, keeping the entries of the others."""
    path = out / INDEX_FILE
    old = json.loads(path.read_text())["adapters"] if path.is_file() else []
    entries = {entry["name"]: entry for entry in old}
    for style in styles:
        entries[style.name] = {
            "name": style.name,
            "folder": style.name,
            "summary": style.summary,
            "rank": style.rank,
            "targets": list(style.targets),
            "train_seconds": round(results[style.name].seconds),
            "held_out_rate": evaluations[style.name].rate,
            "base_rate": evaluations[style.name].base_rate,
        }
    order = [style.name for style in STYLES]
    index = {
        "base_model": base_name,
        "base_digest": digest,
        "adapters": sorted(
            entries.values(), key=lambda e: order.index(e["name"]) if e["name"] in order else len(order)
        ),
    }
    path.write_text(json.dumps(index, indent=2) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
