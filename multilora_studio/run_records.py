"""A record of one run with every input needed to run it again, and the history of runs on disk.

Plain data and JSON (no Qt): the Compare view writes one record per send, exports carry it,
and a record read back reruns with the same prompts, settings and adapters. The history keeps
the newest ``HISTORY_LIMIT`` records as one JSON file each under ``paths.runs_dir()``.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from multilora_studio import __version__
from multilora_studio.engine import Prompt, SamplingParams, ServingEngine
from multilora_studio.paths import runs_dir
from multilora_studio.util import sha256_file

log = logging.getLogger(__name__)

RECORD_VERSION = 1
HISTORY_LIMIT = 500
ADAPTER_WEIGHTS = "adapter_model.safetensors"
BASE = "base"  # the column of the model without an adapter
STRENGTH_MARK = " x"  # "demo-pirate x0.5": the adapter at half strength (adapter names hold no space)
SWEEP_STRENGTHS = (0.25, 0.5, 1.0)  # Compare's one-click strength sweep


def strength_column(adapter: str, scale: float) -> str:
    """The column name of ``adapter`` at strength ``scale`` (its own name at 1)."""
    return adapter if scale == 1.0 else f"{adapter}{STRENGTH_MARK}{scale:g}"


def column_choice(name: str) -> tuple[str | None, float]:
    """(the adapter, None for the base; its strength) of a column name."""
    if name == BASE:
        return None, 1.0
    adapter, mark, scale = name.rpartition(STRENGTH_MARK)
    if mark and adapter:
        try:
            return adapter, float(scale)
        except ValueError:
            pass
    return name, 1.0


@dataclass(frozen=True)
class RunSettings:
    """How a column samples (the shared settings, or a column's after its overrides)."""

    max_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False

    def sampling_params(self) -> SamplingParams:
        """The engine's params (ValueError for a value it refuses)."""
        return SamplingParams(
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            seed=self.seed,
            stop=self.stop,
            ignore_eos=self.ignore_eos,
        )

    def with_overrides(self, overrides: ColumnOverrides) -> RunSettings:
        return replace(self, **{key: value for key, value in asdict(overrides).items() if value is not None})

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunSettings:
        return cls(**{**data, "stop": tuple(data.get("stop", ()))})


@dataclass(frozen=True)
class ColumnOverrides:
    """One column's own settings; None takes the shared value."""

    temperature: float | None = None
    max_tokens: int | None = None
    stop: tuple[str, ...] | None = None
    seed: int | None = None

    @property
    def empty(self) -> bool:
        return all(value is None for value in asdict(self).values())

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ColumnOverrides:
        stop = data.get("stop")
        return cls(**{**data, "stop": None if stop is None else tuple(stop)})


@dataclass(frozen=True)
class ColumnOutput:
    """What a column's request produced."""

    text: str
    token_ids: tuple[int, ...]
    finish_reason: str | None
    error: str | None = None
    ttft_s: float | None = None
    queue_s: float | None = None
    tokens_per_second: float | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ColumnOutput:
        return cls(**{**data, "token_ids": tuple(data["token_ids"])})


@dataclass(frozen=True)
class ColumnRun:
    """One column of a run: its adapter (None = the base), what it was sent and what came back."""

    name: str
    adapter: str | None
    adapter_digest: str | None  # SHA-256 of adapter_model.safetensors (None for the base)
    overrides: ColumnOverrides
    settings: RunSettings  # the shared settings with the overrides applied: what was sent
    prompt: Prompt  # chat messages (its own history) or raw text, as sent
    output: ColumnOutput | None = None
    adapter_source: str | None = None  # where the library got it: a folder, or a Hub repo@revision
    adapter_scale: float = 1.0  # the adapter's strength (SamplingParams.adapter_scale)
    # the base model it ran on, when the run had several (None: the record's engine)
    base: EngineRecord | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ColumnRun:
        output = data.get("output")
        return cls(
            name=data["name"],
            adapter=data["adapter"],
            adapter_digest=data["adapter_digest"],
            overrides=ColumnOverrides.from_dict(data["overrides"]),
            settings=RunSettings.from_dict(data["settings"]),
            prompt=data["prompt"],
            output=None if output is None else ColumnOutput.from_dict(output),
            adapter_source=data.get("adapter_source"),
            adapter_scale=data.get("adapter_scale", 1.0),
            base=None if data.get("base") is None else EngineRecord(**data["base"]),
        )


@dataclass(frozen=True)
class EngineRecord:
    """The engine a run ran on."""

    model_name: str
    model_digest: str
    dtype: str
    device: str
    max_loras: int
    max_lora_rank: int
    version: str = __version__
    batch_invariant: bool | None = None  # None: recorded before the record kept it

    @classmethod
    def of(cls, engine: ServingEngine) -> EngineRecord:
        return cls(
            model_name=engine.model_name,
            model_digest=engine.base_digest,
            dtype=str(engine.dtype).removeprefix("torch."),
            device=str(engine.device),
            max_loras=engine.config.max_loras,
            max_lora_rank=engine.config.max_lora_rank,
            batch_invariant=engine.config.batch_invariant,
        )

    def describe(self) -> str:
        """The engine in one line of Markdown (the exports' header)."""
        invariant = {True: ", batch-invariant", False: ", not batch-invariant", None: ""}[
            self.batch_invariant
        ]
        return (
            f"Base `{self.model_name}` sha256 `{self.model_digest or 'unknown'}`, dtype {self.dtype} on "
            f"{self.device}, max_loras {self.max_loras}, max_lora_rank {self.max_lora_rank}{invariant}, "
            f"MultiLoRA Studio {self.version}"
        )


@dataclass(frozen=True)
class RunRecord:
    """One run (see the module docstring); ``user_turns`` are the chat's user messages so far."""

    engine: EngineRecord
    raw: bool
    system_prompt: str
    user_turns: tuple[str, ...]
    shared: RunSettings
    columns: tuple[ColumnRun, ...]
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: float = field(default_factory=time.time)
    kind: str = "compare"

    def to_dict(self) -> dict[str, Any]:
        return {"record_version": RECORD_VERSION, **asdict(self)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, ensure_ascii=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunRecord:
        """Read a record back; ValueError when it is not one this version can rerun."""
        if data.get("record_version") != RECORD_VERSION:
            raise ValueError(f"not a run record of version {RECORD_VERSION}: {data.get('record_version')!r}")
        try:
            return cls(
                engine=EngineRecord(**data["engine"]),
                raw=bool(data["raw"]),
                system_prompt=data["system_prompt"],
                user_turns=tuple(data["user_turns"]),
                shared=RunSettings.from_dict(data["shared"]),
                columns=tuple(ColumnRun.from_dict(column) for column in data["columns"]),
                id=data["id"],
                created=data["created"],
                kind=data.get("kind", "compare"),
            )
        except (KeyError, TypeError) as error:
            raise ValueError(f"the run record is incomplete: {error}") from error

    @classmethod
    def from_json(cls, text: str) -> RunRecord:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"not JSON: {error}") from error
        if not isinstance(data, dict):
            raise ValueError("a run record is a JSON object")
        return cls.from_dict(data)

    def title(self) -> str:
        """A one-line description for lists."""
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.created))
        first = (self.user_turns[-1] if self.user_turns else "").replace("\n", " ")
        turn = f"turn {len(self.user_turns)}: " if len(self.user_turns) > 1 else ""
        names = ", ".join(column.name for column in self.columns)
        return f"{stamp}  {turn}{first[:60]}  [{names}]"


class AdapterDigests:
    """SHA-256 of each adapter folder's weights, computed once per file version (size, mtime)."""

    def __init__(self) -> None:
        self._known: dict[tuple[str, int, int], str] = {}

    def of(self, folder: Path) -> str:
        weights = Path(folder) / ADAPTER_WEIGHTS
        try:
            stat = weights.stat()
        except OSError:
            return ""
        key = (str(weights), stat.st_size, stat.st_mtime_ns)
        if key not in self._known:
            self._known[key] = sha256_file(weights)
        return self._known[key]


class RunHistory:
    """The newest run records, one JSON file each in ``folder`` (``paths.runs_dir()`` by default)."""

    def __init__(self, folder: Path | None = None, limit: int = HISTORY_LIMIT) -> None:
        self.folder = folder or runs_dir()
        self.limit = limit

    def add(self, record: RunRecord) -> Path:
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"{int(record.created * 1000):015d}-{record.id}.json"
        partial = path.with_suffix(".partial")
        partial.write_text(record.to_json(), encoding="utf-8")
        partial.replace(path)
        for old in self._files()[self.limit :]:
            old.unlink(missing_ok=True)
        return path

    def records(self) -> list[RunRecord]:
        """Every readable record, newest first (an unreadable file is logged and skipped)."""
        found = []
        for path in self._files():
            try:
                found.append(RunRecord.from_json(path.read_text(encoding="utf-8")))
            except (OSError, ValueError) as error:
                log.warning("skipping run record %s: %s", path, error)
        return found

    def get(self, record_id: str) -> RunRecord:
        for record in self.records():
            if record.id == record_id:
                return record
        raise ValueError(f"no run {record_id!r} in the history")

    def _files(self) -> list[Path]:
        if not self.folder.is_dir():
            return []
        return sorted(self.folder.glob("*.json"), reverse=True)
