"""Every prompt of a set through every adapter (and the base), in batched runs through one Engine.

A batch holds ``batch_prompts`` prompts with every adapter, their generations and the scoring of
their references and choices, submitted together (``Engine.submit_many``): the engine runs the
adapters side by side in the same steps. ``progress(fraction, message)`` is called after each
finished request (it may raise to stop the run); ``cancel`` (an Event) stops it within
``POLL_S``. A stopped or failed run aborts the requests it still has in the engine.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from multilora_studio.engine import (
    MAX_SEED,
    EngineStopped,
    Prompt,
    RequestOutput,
    RequestStream,
    SamplingParams,
    ServingEngine,
)
from multilora_studio.evaluate.prompt_set import PromptCase, PromptSet
from multilora_studio.evaluate.results import Cell, EvalResults, PromptRow, adapter_scores
from multilora_studio.evaluate.scoring import Continuation, continuation, summed_logprob
from multilora_studio.run_records import BASE, AdapterDigests, EngineRecord
from multilora_studio.util import ProgressCallback

POLL_S = 0.1


class EvalCancelled(RuntimeError):
    """The run was cancelled (a RuntimeError, so callers report it like any stopped run)."""


@dataclass(frozen=True)
class EvalSettings:
    """How each prompt is generated; ``chat`` sends text prompts as one user message."""

    max_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    chat: bool = False
    batch_prompts: int = 8

    def __post_init__(self) -> None:
        if self.batch_prompts < 1:
            raise ValueError("batch_prompts must be at least 1")
        self.sampling_params()  # SamplingParams checks the rest

    def sampling_params(self) -> SamplingParams:
        return SamplingParams(
            max_tokens=self.max_tokens, temperature=self.temperature, top_p=self.top_p, seed=self.seed
        )

    @property
    def greedy(self) -> bool:
        return self.sampling_params().greedy

    def seeded(self) -> EvalSettings:
        """These settings with a seed when they sample and have none, so a rerun samples the same."""
        if self.greedy or self.seed is not None:
            return self
        return replace(self, seed=secrets.randbelow(MAX_SEED + 1))

    def to_dict(self) -> dict[str, Any]:
        """The settings as the results record them, with whether the run was greedy (seed unused)."""
        return {**asdict(self), "greedy": self.greedy}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EvalSettings:
        """Read ``to_dict`` back (``greedy`` follows from the rest)."""
        names = {item.name for item in fields(cls)}
        return cls(**{key: value for key, value in data.items() if key in names})

    def prompt_of(self, case: PromptCase) -> Prompt:
        if self.chat and isinstance(case.prompt, str):
            return [{"role": "user", "content": case.prompt}]
        return case.prompt


@dataclass(frozen=True)
class _Plan:
    """One prompt's requests: its generation, then each continuation to score, per adapter
    (an adapter with its own tokenizer or template encodes them its way)."""

    case: PromptCase
    prompt: Prompt
    continuations: dict[str, tuple[Continuation, ...]]

    @property
    def requests_per_adapter(self) -> int:
        return 1 + len(next(iter(self.continuations.values())))


def run_eval(
    engine: ServingEngine,
    prompt_set: PromptSet,
    adapters: Sequence[str],
    settings: EvalSettings | None = None,
    progress: ProgressCallback | None = None,
    cancel: threading.Event | None = None,
    digests: AdapterDigests | None = None,
) -> EvalResults:
    """The results of every prompt through every adapter (``'base'`` = no adapter).

    A sampled run without a seed gets one (``EvalSettings.seeded``), recorded in the results;
    ``digests`` caches the adapters' weight digests across runs.
    """
    settings = (settings or EvalSettings()).seeded()
    names = check_adapters(engine, adapters)
    folders = {info.name: info.path for info in engine.list_adapters() if info.name in names}
    known = digests or AdapterDigests()
    adapter_digests = {name: known.of(folder) for name, folder in folders.items()}
    plans = [plan(engine, case, settings, names) for case in prompt_set.cases]
    per_prompt = [len(names) * p.requests_per_adapter for p in plans]
    total, done = sum(per_prompt), 0
    cells: list[Cell] = []
    for first in range(0, len(plans), settings.batch_prompts):
        batch = plans[first : first + settings.batch_prompts]
        requests: list[tuple[Prompt, str | None, SamplingParams | None]] = []
        for item in batch:
            for name in names:
                adapter = None if name == BASE else name
                requests.append((item.prompt, adapter, settings.sampling_params()))
                requests += [(c.token_ids, adapter, c.params) for c in item.continuations[name]]
        outputs = wait_all(engine, engine.submit_many(requests), cancel, progress, done, total)
        done += len(requests)
        position = 0
        for offset, item in enumerate(batch):
            for name in names:
                count = item.requests_per_adapter
                cells.append(cell(first + offset, name, item, outputs[position : position + count]))
                position += count
    return EvalResults(
        prompt_set=prompt_set.name,
        prompt_set_digest=prompt_set.digest,
        model=engine.model_name,
        base_digest=engine.base_digest,
        adapters=names,
        settings=settings.to_dict(),
        prompts=[
            PromptRow(
                row=p.case.row,
                prompt=p.case.prompt_text,
                chat=not isinstance(p.prompt, str),
                reference=p.case.reference,
                check=None if p.case.check is None else p.case.check.to_spec(),
            )
            for p in plans
        ],
        cells=cells,
        created=time.time(),
        scores=adapter_scores(names, cells),
        engine=EngineRecord.of(engine),
        adapter_digests=adapter_digests,
        adapter_folders={name: str(folder) for name, folder in folders.items()},
        prompt_set_path=prompt_set.path,
        default_check=prompt_set.default_check,
    )


def check_adapters(engine: ServingEngine, adapters: Sequence[str]) -> list[str]:
    """The names to evaluate, each once and each known to the engine (or 'base')."""
    names = list(dict.fromkeys(name.strip() for name in adapters if name.strip()))
    if not names:
        raise ValueError(f"name at least one adapter (or '{BASE}') to evaluate")
    known = {info.name for info in engine.list_adapters()}
    unknown = [name for name in names if name != BASE and name not in known]
    if unknown:
        raise ValueError(
            f"unknown adapters {', '.join(unknown)}; the engine has {', '.join(sorted(known)) or 'none'}"
        )
    return names


def plan(engine: ServingEngine, case: PromptCase, settings: EvalSettings, names: Sequence[str]) -> _Plan:
    """The prompt's requests for each of ``names``; a prompt the engine refuses is an error
    naming its row."""
    prompt = settings.prompt_of(case)
    texts = [case.reference] if case.reference is not None else []
    if case.check is not None and case.check.kind == "choice":
        texts += [c for c in case.check.argument if c != case.reference]
    continuations = {}
    try:
        for name in names:
            adapter = None if name == BASE else name
            context = engine.encode(prompt, adapter=adapter)
            if len(context) >= engine.config.max_model_len:
                raise ValueError(
                    f"the prompt has {len(context)} tokens; max_model_len is {engine.config.max_model_len}"
                )
            continuations[name] = tuple(continuation(engine, context, text, adapter) for text in texts)
    except ValueError as error:
        raise ValueError(f"row {case.row}: {error}") from None
    return _Plan(case, prompt, continuations)


def wait_all(
    engine: ServingEngine,
    streams: list[RequestStream],
    cancel: threading.Event | None,
    progress: ProgressCallback | None,
    done: int,
    total: int,
) -> list[RequestOutput]:
    """Every stream's output in order; on cancel or any error the unfinished ones are aborted."""
    outputs: list[RequestOutput] = []
    try:
        for stream in streams:
            outputs.append(wait_one(stream, cancel))
            if outputs[-1].error:
                raise RuntimeError(f"a request failed: {outputs[-1].error}")
            if progress is not None:
                finished = done + len(outputs)
                progress(finished / total, f"{finished} of {total} requests")
    except BaseException:
        for stream in streams[len(outputs) :]:
            try:
                engine.abort(stream.request_id)
            except EngineStopped:  # its requests ended already
                break
        raise
    return outputs


def wait_one(stream: RequestStream, cancel: threading.Event | None) -> RequestOutput:
    while True:
        if cancel is not None and cancel.is_set():
            raise EvalCancelled("the evaluation was cancelled")
        try:
            return stream.result(timeout=POLL_S)
        except TimeoutError:
            continue


def cell(index: int, name: str, item: _Plan, outputs: list[RequestOutput]) -> Cell:
    """One prompt x adapter from its generation and its scored continuations."""
    generated, scored = outputs[0], outputs[1:]
    mine = item.continuations[name]
    sums = {c.text: summed_logprob(o, c.start) for c, o in zip(mine, scored, strict=True)}
    case, check = item.case, item.case.check
    chosen = None
    if check is not None and check.kind == "choice":
        chosen = max(check.argument, key=lambda choice: sums[choice])  # ties: the first listed
        passed: bool | None = chosen == case.reference
    else:
        passed = None if check is None else check.passes(generated.text, case.reference)
    reference = case.reference
    first = mine[0] if reference is not None else None
    return Cell(
        prompt=index,
        adapter=name,
        output=generated.text,
        tokens=len(generated.token_ids),
        finish_reason=generated.finish_reason,
        passed=passed,
        chosen=chosen,
        reference_logprob=None if reference is None else sums[reference],
        reference_tokens=0 if first is None else len(first.token_ids) - first.start,
    )
