"""API keys and what each may do: admin keys run everything, user keys only generate, for their models."""

from __future__ import annotations

import fnmatch
import json
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ADMIN = "admin"
USER = "user"
ROLES = (ADMIN, USER)
MIN_KEY_LENGTH = 8
KEY_FIELDS = frozenset({"key", "key_env", "role", "models", "name"})


@dataclass(frozen=True)
class ApiKey:
    """One bearer key.

    ``role`` admin: every route (load/unload adapters, metrics, every model). ``role`` user:
    generation, tokenize and the model list, for the models whose id matches one of ``models``
    (shell-style patterns such as ``team-a-*``; None: every model). ``name`` labels the key in
    the request log, the metrics and the per-key limits; it is never the key itself.
    """

    secret: str
    role: str = ADMIN
    models: tuple[str, ...] | None = None
    name: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.secret, str) or len(self.secret.strip()) < MIN_KEY_LENGTH:
            raise ValueError(f"API keys must be at least {MIN_KEY_LENGTH} characters long")
        if self.secret != self.secret.strip():
            raise ValueError("an API key may not start or end with white space")
        if self.role not in ROLES:
            raise ValueError(f"an API key's role must be one of {', '.join(ROLES)}, got {self.role!r}")
        if self.models is not None:
            if self.role == ADMIN:
                raise ValueError("an admin key may use every model: give `models` to user keys only")
            if isinstance(self.models, str) or not all(isinstance(m, str) and m.strip() for m in self.models):
                raise ValueError(f"`models` must be a list of model names or patterns, got {self.models!r}")

    @property
    def admin(self) -> bool:
        return self.role == ADMIN

    def may_use(self, model: str) -> bool:
        """Whether this key may generate with (and see) the model ``model``."""
        return self.models is None or any(fnmatch.fnmatchcase(model, pattern) for pattern in self.models)


ANONYMOUS = ApiKey("anonymous-caller", ADMIN, None, "anonymous")  # every caller when no key is set


def named_keys(keys: Iterable[str | ApiKey]) -> tuple[ApiKey, ...]:
    """Plain strings become admin keys; unnamed keys are named ``key-N``; secrets and names unique."""
    named: list[ApiKey] = []
    for number, given in enumerate(keys, 1):
        key = ApiKey(given.strip()) if isinstance(given, str) else given
        if not isinstance(key, ApiKey):
            raise ValueError(f"api_keys must hold strings or ApiKey entries, got {key!r}")
        named.append(key if key.name else ApiKey(key.secret, key.role, key.models, f"key-{number}"))
    if len({key.secret for key in named}) < len(named):
        raise ValueError("the same API key is given twice")
    if len({key.name for key in named}) < len(named):
        raise ValueError("two API keys have the same name")
    return tuple(named)


def _entry(number: int, entry: Any, source: Path) -> ApiKey:
    where = f"{source}: entry {number}"
    if not isinstance(entry, dict):
        raise ValueError(f"{where} must be an object with `key` (or `key_env`), `role`, `models`, `name`")
    unknown = sorted(set(entry) - KEY_FIELDS)
    if unknown:
        raise ValueError(f"{where} has unknown fields {unknown}; known: {sorted(KEY_FIELDS)}")
    if ("key" in entry) == ("key_env" in entry):
        raise ValueError(f"{where} needs exactly one of `key` and `key_env`")
    secret = str(entry.get("key", ""))
    if "key_env" in entry:
        secret = os.environ.get(str(entry["key_env"]), "")
        if not secret.strip():
            raise ValueError(f"{where}: the variable ${entry['key_env']} is not set or empty")
    models = entry.get("models")
    try:
        return ApiKey(
            secret,
            entry.get("role", USER),
            tuple(models) if isinstance(models, list) else models,
            str(entry.get("name", f"key-{number}")),
        )
    except ValueError as error:
        raise ValueError(f"{where}: {error}") from None


def read_keys_file(path: str | Path) -> tuple[ApiKey, ...]:
    """Keys from a JSON list of ``{"key" | "key_env", "role", "models", "name"}`` (role defaults to user).

    The file holds secrets, so one that other users can read is refused (as ssh refuses keys).
    """
    source = Path(path)
    try:
        mode = source.stat().st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise ValueError(f"{source} can be read by other users: chmod 600 {source}")
        entries = json.loads(source.read_text(encoding="utf-8"))
    except OSError as error:
        raise ValueError(f"cannot read the keys file {source}: {error.strerror or error}") from None
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        raise ValueError(f"{source} is not a JSON list of keys: {error}") from None
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{source} must hold a non-empty JSON list of keys")
    return tuple(_entry(number, entry, source) for number, entry in enumerate(entries, 1))
