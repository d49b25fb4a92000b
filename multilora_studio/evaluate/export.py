"""Results as CSV, JSON or Markdown, and the saved results file.

CSV has one line per cell (prompt x adapter) and reads back into the same cells
(``read_cells_csv``), each line with the run's record (``record_columns``: prompt set, engine,
settings, the cell's adapter digest); JSON is the whole ``EvalResults`` and reads back into it
(``read_results_json``); Markdown is a header block with the record, the scores table and every
prompt's outputs.
"""

from __future__ import annotations

import csv
import io
import json
import time
from pathlib import Path

from multilora_studio.evaluate.results import Cell, EvalResults
from multilora_studio.paths import data_dir
from multilora_studio.run_records import BASE

FORMATS = ("csv", "json", "md")
RESULTS_DIR = "evaluations"
CSV_COLUMNS = (
    "prompt", "row", "adapter", "prompt_text", "reference", "output", "tokens", "finish_reason",
    "passed", "chosen", "reference_logprob", "reference_tokens", "adapter_digest",
)  # fmt: skip
RECORD_COLUMNS = (
    "prompt_set", "prompt_set_digest", "model", "model_digest", "dtype", "device", "max_loras",
    "max_lora_rank", "batch_invariant", "version", "settings",
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
    """A saved results file (or JSON export); ValueError saying why when it is not one."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        return EvalResults.from_dict(data)
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise ValueError(f"{path} is not a saved evaluation: {error!r}") from None


def recent_results(directory: Path | None = None, limit: int = 10) -> list[Path]:
    """The newest saved results files in ``directory`` (default: where they are saved), newest first."""
    folder = Path(directory).expanduser() if directory is not None else default_results_dir()
    if not folder.is_dir():
        return []
    files = [path for path in folder.glob("*.json") if path.is_file()]
    return sorted(files, key=lambda path: path.stat().st_mtime_ns, reverse=True)[:limit]


def record_columns(results: EvalResults) -> dict[str, str]:
    """The run's record as the CSV's columns (the engine's "" in files saved before it was kept)."""
    engine = results.engine
    return {
        "prompt_set": results.prompt_set,
        "prompt_set_digest": results.prompt_set_digest,
        "model": results.model,
        "model_digest": results.base_digest,
        "dtype": "" if engine is None else engine.dtype,
        "device": "" if engine is None else engine.device,
        "max_loras": "" if engine is None else str(engine.max_loras),
        "max_lora_rank": "" if engine is None else str(engine.max_lora_rank),
        "batch_invariant": "" if engine is None else _text(engine.batch_invariant),
        "version": "" if engine is None else engine.version,
        "settings": json.dumps(results.settings, sort_keys=True),
    }


def to_csv(results: EvalResults) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(CSV_COLUMNS + RECORD_COLUMNS)
    record = list(record_columns(results).values())
    for cell in results.cells:
        prompt = results.prompts[cell.prompt]
        writer.writerow(
            [
                cell.prompt, prompt.row, cell.adapter, prompt.prompt, _text(prompt.reference), cell.output,
                cell.tokens, _text(cell.finish_reason), _text(cell.passed), _text(cell.chosen),
                _text(None if cell.reference_logprob is None else repr(cell.reference_logprob)),
                cell.reference_tokens, results.adapter_digests.get(cell.adapter, ""), *record,
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


def header_lines(results: EvalResults) -> list[str]:
    """The Markdown header block: prompt set, engine, adapters' digests and settings."""
    engine = (
        results.engine.describe()
        if results.engine is not None
        else f"Base `{results.model}` sha256 `{results.base_digest or 'unknown'}` (engine not recorded)"
    )
    digests = ", ".join(
        f"`{name}` sha256 `{results.adapter_digests.get(name) or 'not recorded'}`"
        for name in results.adapters
        if name != BASE
    )
    settings = ", ".join(f"{key}={value}" for key, value in results.settings.items())
    check = "the file's" if results.default_check is None else json.dumps(results.default_check)
    return [
        f"- Prompt set `{results.prompt_set}` sha256 `{results.prompt_set_digest}`, "
        f"{len(results.prompts)} prompts, default check {check}"
        + (f", file `{results.prompt_set_path}`" if results.prompt_set_path else ""),
        f"- {engine}",
        f"- Adapters: {digests or 'base only'}",
        f"- Settings: {settings}",
    ]


def to_markdown(results: EvalResults) -> str:
    lines = [
        f"# Evaluation of {results.prompt_set} on {results.model}",
        "",
        *header_lines(results),
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
