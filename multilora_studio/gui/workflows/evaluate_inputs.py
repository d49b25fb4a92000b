"""What an evaluation runs, as the Evaluate view's inputs say: the prompt set, the base model, the
adapters ticked (and the base), max tokens, the check of rows without one, chat; remembered."""

from __future__ import annotations

from collections.abc import Callable

from multilora_studio.demo import demo_adapter_dirs
from multilora_studio.deploy import BasePool
from multilora_studio.evaluate import BASE, EvalResults, EvalSettings
from multilora_studio.gui.workflows.events import Field, Observable
from multilora_studio.gui.workflows.remembered import Store

DEFAULT_CHECKS = ("the file's", "exact", "contains")  # the first: each row's own check only
# ``changed`` names beside the fields: the bases and adapters listed, which of them are ticked
ENTRIES, TICKS = "entries", "ticks"


class EvaluateInputs(Observable):
    """The adapters listed are the base ``shown``'s: the one picked (``picked``, kept while it is not
    served), else the first; the ticks (``wanted``) survive relisting."""

    prompt_set = Field("")
    max_tokens = Field(EvalSettings().max_tokens)
    chat = Field(False)
    default_check = Field(DEFAULT_CHECKS[0])

    def __init__(self, pools: Callable[[], BasePool | None]) -> None:
        super().__init__()
        self.pools = pools
        self.wanted: set[str] = {BASE}
        self.picked: str | None = None
        self.shown: str | None = None

    # ---------------------------------------------------------------- the base and its adapters

    def bases(self) -> list[str]:
        pool = self.pools()
        return [] if pool is None else pool.names

    def relist(self) -> None:
        """List the bases and the adapters again (the engine's changed, or the ticks were set)."""
        if self.shown is not None:
            self.picked = self.shown
        bases = self.bases()
        self.shown = self.picked if self.picked in bases else (bases[0] if bases else None)
        self.changed.emit(ENTRIES)

    def pick_base(self, base: str | None) -> bool:
        """Evaluate on ``base``: list its adapters; False when the engine does not serve it."""
        if base is None or base not in self.bases():
            return False
        self.picked = self.shown = base
        self.changed.emit(ENTRIES)
        return True

    def listed(self) -> list[str]:
        """'base' and every adapter the shown base serves."""
        pool = self.pools()
        if pool is None or self.shown is None:
            return []
        return [BASE, *sorted(pool.adapters_of(self.shown))]

    def ticked(self) -> list[str]:
        return [name for name in self.listed() if name in self.wanted]

    def set_ticked(self, name: str, ticked: bool) -> None:
        if (name in self.wanted) == ticked:
            return
        if ticked:
            self.wanted.add(name)
        else:
            self.wanted.discard(name)
        self.changed.emit(TICKS)

    def tick(self, names: list[str]) -> None:
        """Tick exactly ``names``."""
        self.wanted = set(names)
        self.relist()

    def tick_all(self, ticked: bool) -> None:
        listed = set(self.listed())
        self.wanted = self.wanted | listed if ticked else self.wanted - listed
        self.changed.emit(TICKS)

    def tick_demo(self) -> None:
        """The demo prompt set was chosen: tick the base and the demo adapters."""
        self.tick([BASE, *demo_adapter_dirs()])

    # ---------------------------------------------------------------- settings

    def settings(self) -> EvalSettings:
        return EvalSettings(max_tokens=self.max_tokens, chat=self.chat)

    def check_kind(self) -> str | None:
        """The check of rows without one (None: each row's own check only)."""
        return None if self.default_check == DEFAULT_CHECKS[0] else self.default_check

    def show(self, saved: EvalResults) -> None:
        """Show what ``saved`` ran: its prompt set, adapters, max tokens, check and chat."""
        settings = EvalSettings.from_dict(saved.settings)
        self.prompt_set = saved.prompt_set_path
        self.tick(saved.adapters)
        self.max_tokens = settings.max_tokens
        self.chat = settings.chat
        kind = None if saved.default_check is None else saved.default_check.get("type")
        self.default_check = kind if kind in DEFAULT_CHECKS else DEFAULT_CHECKS[0]

    # ---------------------------------------------------------------- remembered

    def save(self, store: Store) -> None:
        store.set("evaluate/prompt_set", self.prompt_set)
        store.set("evaluate/base", self.shown or self.picked or "")
        store.set("evaluate/adapters", sorted(self.wanted))
        store.set("evaluate/max_tokens", self.max_tokens)
        store.set("evaluate/default_check", self.default_check)
        store.set("evaluate/chat", self.chat)

    def restore(self, store: Store) -> None:
        self.prompt_set = store.get("evaluate/prompt_set", "")
        self.picked = store.get("evaluate/base", "") or None
        self.tick(store.get("evaluate/adapters", [BASE]))
        self.max_tokens = store.get("evaluate/max_tokens", EvalSettings().max_tokens)
        check = store.get("evaluate/default_check", DEFAULT_CHECKS[0])
        self.default_check = check if check in DEFAULT_CHECKS else DEFAULT_CHECKS[0]
        self.chat = store.get("evaluate/chat", False)
