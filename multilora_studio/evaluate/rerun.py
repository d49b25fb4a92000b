"""Rerun a saved evaluation: the same prompt set file, adapters, settings and base, checked first.

``Rerun.of`` reads the prompt set again with the recorded default check and refuses it when its
SHA-256 changed; ``check_engine`` refuses an engine on other base weights, and adapters whose
weights changed (unless allowed), and returns warnings for what may make outputs differ
(dtype, device, batch invariance, version, digests the old file did not record).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

from multilora_studio.engine import ServingEngine
from multilora_studio.evaluate.prompt_set import PromptSet, load_prompt_set
from multilora_studio.evaluate.results import EvalResults
from multilora_studio.evaluate.runner import EvalSettings, run_eval
from multilora_studio.run_records import BASE, AdapterDigests, EngineRecord
from multilora_studio.util import ProgressCallback, sha256_file


@dataclass(frozen=True)
class Rerun:
    """A saved evaluation ready to run again: its results, prompt set and settings."""

    saved: EvalResults
    prompt_set: PromptSet
    settings: EvalSettings

    @classmethod
    def of(cls, saved: EvalResults, prompts: Path | None = None) -> Rerun:
        """Read the recorded prompt set (or ``prompts``, where it moved); ValueError when it changed."""
        path = prompts if prompts is not None else saved.prompt_set_path
        if not path:
            raise ValueError(
                "these results do not record their prompt set's file (saved by an older version); "
                "rerun them with multilora-studio eval --rerun RESULTS.json --prompts FILE"
            )
        if not Path(path).expanduser().is_file():
            raise ValueError(
                f"the prompt set {path} of these results is gone; give its new place with --prompts"
            )
        digest = sha256_file(Path(path).expanduser())
        if digest != saved.prompt_set_digest:
            raise ValueError(
                f"the prompt set {path} changed since the evaluation (sha256 {digest[:12]}, "
                f"recorded {saved.prompt_set_digest[:12]}); a rerun needs the same file"
            )
        prompt_set = load_prompt_set(Path(path), saved.default_check)
        return cls(saved, prompt_set, EvalSettings.from_dict(saved.settings))

    @property
    def adapters(self) -> list[str]:
        return [name for name in self.saved.adapters if name != BASE]

    def check_base(self, engine: ServingEngine) -> None:
        """ValueError when ``engine`` runs other base weights than the evaluation (unknown: another name)."""
        saved = self.saved
        if saved.base_digest != engine.base_digest or (
            not saved.base_digest and saved.model != engine.model_name
        ):
            raise ValueError(
                f"the evaluation ran on {saved.model} (sha256 {saved.base_digest[:12] or 'unknown'}); this "
                f"engine runs {engine.model_name} (sha256 {engine.base_digest[:12] or 'unknown'}): rerun it "
                "on the same base (--model FOLDER, or the window's Settings)"
            )

    def check_engine(
        self, engine: ServingEngine, digests: AdapterDigests, allow_changed_adapters: bool = False
    ) -> list[str]:
        """Warnings for ``engine``; ValueError for other base weights or changed adapters."""
        self.check_base(engine)
        saved = self.saved
        served = {info.name: info.path for info in engine.list_adapters()}
        missing = [name for name in self.adapters if name not in served]
        if missing:
            raise ValueError(f"the engine does not serve {', '.join(missing)}, which the evaluation ran")
        warnings = engine_warnings(saved.engine, EngineRecord.of(engine))
        for name in self.adapters:
            recorded, current = saved.adapter_digests.get(name), digests.of(served[name])
            if recorded is None:
                warnings.append(f"the results do not record {name}'s weights digest; it was not checked")
            elif recorded != current:
                message = (
                    f"adapter {name}'s weights changed since the evaluation "
                    f"(sha256 {current[:12] or 'none'}, "
                    f"recorded {recorded[:12]})"
                )
                if not allow_changed_adapters:
                    raise ValueError(message + "; a rerun needs the same weights")
                warnings.append(message + ": outputs may differ")
        return warnings

    def run(
        self,
        engine: ServingEngine,
        progress: ProgressCallback | None = None,
        cancel: threading.Event | None = None,
        digests: AdapterDigests | None = None,
    ) -> EvalResults:
        return run_eval(
            engine, self.prompt_set, self.saved.adapters, self.settings, progress, cancel, digests
        )


def engine_warnings(recorded: EngineRecord | None, current: EngineRecord) -> list[str]:
    """What differs between the recorded engine and this one that may change outputs."""
    if recorded is None:
        return ["the results do not record the engine's dtype, device and batch invariance"]
    warnings = []
    if recorded.dtype != current.dtype:
        warnings.append(f"the evaluation ran in {recorded.dtype}, this engine in {current.dtype}")
    if recorded.device.split(":")[0] != current.device.split(":")[0]:
        warnings.append(f"the evaluation ran on {recorded.device}, this engine on {current.device}")
    if recorded.batch_invariant is not None and recorded.batch_invariant != current.batch_invariant:
        state = {True: "batch-invariant", False: "not batch-invariant"}
        warnings.append(
            f"the evaluation's engine was {state[recorded.batch_invariant]}, this one is "
            f"{state[bool(current.batch_invariant)]}"
        )
    if recorded.version != current.version:
        warnings.append(
            f"the evaluation ran on MultiLoRA Studio {recorded.version}, this is {current.version}"
        )
    return warnings


def changed_cells(saved: EvalResults, again: EvalResults) -> int:
    """How many cells of ``again`` differ from the saved ones (output, verdict or choice)."""
    before = {(cell.prompt, cell.adapter): cell for cell in saved.cells}
    return sum(
        1
        for cell in again.cells
        if (old := before.get((cell.prompt, cell.adapter))) is None
        or (old.output, old.passed, old.chosen) != (cell.output, cell.passed, cell.chosen)
    )
