"""Results as CSV, JSON or Markdown, and the saved results file.

CSV has one line per cell (prompt x adapter) and reads back into the same cells
(``read_cells_csv``); JSON is the whole ``EvalResults`` and reads back into it
(``read_results_json``); Markdown is the scores table and every prompt's outputs.
"""

from __future__ import annotations

import csv
import io
import json
import time
from pathlib import Path

from multilora_studio.evaluate.results import Cell, EvalResults
from multilora_studio.paths import data_dir

FORMATS = ("csv", "json", "md")
RESULTS_DIR = "evaluations"
CSV_COLUMNS = (
    "prompt", "row", "adapter", "prompt_text", "reference", "output", "tokens", "finish_reason",
    "passed", "chosen", "reference_logprob", "reference_tokens",
)  # fmt: skip


def render(results: EvalResults, fmt: str) -> str:
    if fmt == "csv":
        return to_csv(results)
    if fmt == "json":
        return json.dumps(results.to_dict(), indent=2, ensure_ascii=False) + "\n"
    if fmt == "md":
        return to_markdown(results)
    raise ValueError(f"unknown export format {fmt!r}; one of {', '.join(FORMATS)}")


def write_export(results: EvalResults, path: Path) -> Path:
    """Write ``results`` in the format its suffix names (.csv, .json, .md)."""
    path = Path(path)
    path.write_text(render(results, path.suffix.lower().lstrip(".")), encoding="utf-8")
    return path


def default_results_dir() -> Path:
    return data_dir() / RESULTS_DIR


def save_results(results: EvalResults, directory: Path | None = None) -> Path:
    """The results as ``<prompt set>-<time>.json`` in ``directory`` (default under the user data dir)."""
    folder = Path(directory).expanduser() if directory is not None else default_results_dir()
    folder.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(results.created))
    path = folder / f"{results.prompt_set}-{stamp}.json"
    counter = 1
    while path.exists():
        counter += 1
        path = folder / f"{results.prompt_set}-{stamp}-{counter}.json"
    temporary = path.with_suffix(".json.tmp")
    temporary.write_text(render(results, "json"), encoding="utf-8")
    temporary.replace(path)  # a reader never sees half a file
    return path


def read_results_json(path: Path) -> EvalResults:
    return EvalResults.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))


def to_csv(results: EvalResults) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(CSV_COLUMNS)
    for cell in results.cells:
        prompt = results.prompts[cell.prompt]
        writer.writerow(
            [
                cell.prompt, prompt.row, cell.adapter, prompt.prompt, _text(prompt.reference), cell.output,
                cell.tokens, _text(cell.finish_reason), _text(cell.passed), _text(cell.chosen),
                _text(None if cell.reference_logprob is None else repr(cell.reference_logprob)),
                cell.reference_tokens,
            ]
        )  # fmt: skip
    return buffer.getvalue()


def read_cells_csv(path: Path) -> list[Cell]:
    """The cells of a CSV export (floats written with every digit, so they read back equal)."""
    with Path(path).open(newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    return [
        Cell(
            prompt=int(row["prompt"]),
            adapter=row["adapter"],
            output=row["output"],
            tokens=int(row["tokens"]),
            finish_reason=row["finish_reason"] or None,
            passed={"": None, "True": True, "False": False}[row["passed"]],
            chosen=row["chosen"] or None,
            reference_logprob=float(row["reference_logprob"]) if row["reference_logprob"] else None,
            reference_tokens=int(row["reference_tokens"]),
        )
        for row in rows
    ]


def _text(value: object) -> str:
    return "" if value is None else str(value)


def score_lines(results: EvalResults) -> list[str]:
    """The per-adapter scores as a Markdown table (also what the command line prints)."""
    lines = ["| adapter | passed | pass rate | reference log-prob / token |", "| --- | ---: | ---: | ---: |"]
    for score in results.scores:
        rate = "-" if score.pass_rate is None else f"{score.pass_rate:.1%}"
        logprob = (
            "-" if score.reference_logprob_per_token is None else f"{score.reference_logprob_per_token:.4f}"
        )
        lines.append(f"| {score.adapter} | {score.passed}/{score.checked} | {rate} | {logprob} |")
    return lines


def to_markdown(results: EvalResults) -> str:
    lines = [
        f"# Evaluation of {results.prompt_set} on {results.model}",
        "",
        f"Prompt set sha256 {results.prompt_set_digest[:12]}, base sha256 {results.base_digest[:12] or '-'}, "
        f"{len(results.prompts)} prompts, settings: "
        + ", ".join(f"{key}={value}" for key, value in results.settings.items()),
        "",
        *score_lines(results),
    ]
    marks = {True: "pass", False: "FAIL", None: "-"}
    for index, prompt in enumerate(results.prompts):
        lines += ["", f"## Row {prompt.row}", "", f"**Prompt**: {prompt.prompt}"]
        if prompt.reference is not None:
            lines.append(f"**Reference**: {prompt.reference}")
        for cell in results.row_cells(index):
            fence = "````" if "```" in cell.output else "```"
            chosen = f", chose {cell.chosen!r}" if cell.chosen is not None else ""
            lines += [
                "",
                f"### {cell.adapter} ({marks[cell.passed]}{chosen})",
                "",
                fence + "text",
                cell.output,
                fence,
            ]
    return "\n".join(lines) + "\n"
