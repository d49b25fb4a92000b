"""What the Compare view's inputs say: the message, the system prompt, raw or chat, the shared
settings and how answers show; remembered between sessions."""

from __future__ import annotations

import random

from multilora_studio.gui.stop_strings import format_stop_strings, parse_stop_strings
from multilora_studio.gui.workflows.events import Field, Observable
from multilora_studio.gui.workflows.remembered import Store
from multilora_studio.run_records import RunSettings

DEFAULT_PROMPT = "In one sentence, what is a LoRA adapter?"
SEED_LIMIT = 2**31 - 1  # what a spin box holds; seeds drawn for a run stay below it
RANDOM_SEED = -1  # the seed input's value for "draw one for each run"
MARKDOWN, PLAIN, TOKENS = "markdown", "plain", "tokens"
VIEWS = {
    MARKDOWN: "Markdown",
    PLAIN: "Plain text (differences from base)",
    TOKENS: "Token divergence from base",
}
DEFAULTS = RunSettings()  # compare's defaults on the command line too


class CompareInputs(Observable):
    """The inputs' values; ``stop`` is the stop strings as typed (``stop_strings`` syntax)."""

    system_prompt = Field("")
    message = Field(DEFAULT_PROMPT)
    raw = Field(False)
    max_tokens = Field(DEFAULTS.max_tokens)
    temperature = Field(DEFAULTS.temperature)
    top_p = Field(DEFAULTS.top_p)
    seed = Field(RANDOM_SEED)
    stop = Field("")
    ignore_eos = Field(False)
    view = Field(MARKDOWN)

    def shared_settings(self) -> RunSettings:
        """The shared settings; a random seed is drawn here (ValueError for bad stop strings)."""
        return RunSettings(
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            seed=random.randrange(SEED_LIMIT) if self.seed < 0 else self.seed,
            stop=parse_stop_strings(self.stop),
            ignore_eos=self.ignore_eos,
        )

    def show_shared_settings(self, settings: RunSettings) -> None:
        self.max_tokens = settings.max_tokens
        self.temperature = settings.temperature
        self.top_p = settings.top_p
        self.seed = RANDOM_SEED if settings.seed is None else settings.seed
        self.stop = format_stop_strings(settings.stop)
        self.ignore_eos = settings.ignore_eos

    def save(self, store: Store) -> None:
        store.set("compare/system", self.system_prompt)
        store.set("compare/prompt", self.message)
        store.set("compare/raw", self.raw)
        store.set("compare/max_tokens", self.max_tokens)
        store.set("compare/temperature", self.temperature)
        store.set("compare/top_p", self.top_p)
        store.set("compare/seed", self.seed)
        store.set("compare/stop", self.stop)
        store.set("compare/ignore_eos", self.ignore_eos)
        store.set("compare/view", self.view)

    def restore(self, store: Store) -> None:
        self.system_prompt = store.get("compare/system", "")
        self.message = store.get("compare/prompt", DEFAULT_PROMPT)
        self.raw = store.get("compare/raw", False)
        self.max_tokens = store.get("compare/max_tokens", DEFAULTS.max_tokens)
        self.temperature = store.get("compare/temperature", DEFAULTS.temperature)
        self.top_p = store.get("compare/top_p", DEFAULTS.top_p)
        self.seed = store.get("compare/seed", RANDOM_SEED)
        self.stop = store.get("compare/stop", "")
        self.ignore_eos = store.get("compare/ignore_eos", False)
        view = store.get("compare/view", MARKDOWN)
        self.view = view if view in VIEWS else MARKDOWN
