"""Error messages in the words the user typed: a refused setting (``InvalidSetting``) named by its
flag, and a value the user did not type marked as the default.

``max_cpu_loras (1) must be >= max_loras (8)`` reads ``--max-cpu-loras (1) must be >= --max-loras
(8, the default)`` where the command has both flags; a setting the command has no flag for keeps
its field name.
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Mapping, Sequence

from multilora_studio.adapters.library_errors import NameTaken
from multilora_studio.cli.setting_flags import dest_of
from multilora_studio.invalid_setting import InvalidSetting, SettingWord


def flag_vocabulary(*classes: type) -> dict[str, str]:
    """Each declared setting of ``classes`` that has a flag: field name -> flag."""
    from multilora_studio.engine.settings import declared

    return {item.name: item.setting.flag for cls in classes for item in declared(cls) if item.setting.flag}


@functools.cache
def flags() -> dict[str, str]:
    """The command line's vocabulary: the flags of the engine's, the bases' pool's and the server's
    settings (read when a message needs them: the declarations import the engine)."""
    from multilora_studio.deploy.pool_settings import PoolSettings
    from multilora_studio.engine import EngineConfig
    from multilora_studio.server.config import ServerConfig

    return flag_vocabulary(EngineConfig, PoolSettings, ServerConfig)


def typed_flags(argv: Sequence[str]) -> set[str]:
    """The long flags in a command line, with or without ``=VALUE``."""
    return {item.partition("=")[0] for item in argv if item.startswith("--")}


class FlagWord(SettingWord):
    """A setting as the command names it: its flag where the command has one (``vocabulary``'s,
    else its name with dashes, as vLLM names a request's ``max_tokens`` ``--max-tokens``), the value
    marked as the default where the user did not type the flag (argparse takes unique prefixes)."""

    def __init__(
        self,
        name: str,
        value: object,
        args: argparse.Namespace,
        typed: set[str],
        vocabulary: Mapping[str, str],
    ) -> None:
        super().__init__(name, value)
        flag = vocabulary.get(name) or "--" + name.replace("_", "-")
        self.flag = flag if hasattr(args, dest_of(flag)) else None
        self.default = self.flag is not None and not any(self.flag.startswith(item) for item in typed)

    def word(self) -> str:
        return self.flag or self.name

    def with_value(self, form: str) -> str:
        if not self.default:
            return super().with_value(form)
        if form == "=":
            return f"{self.word()}={self.value} (the default)"
        return f"{self.word()} ({self.value}, the default)"


def in_flag_words(error: BaseException, args: argparse.Namespace, typed: set[str]) -> str:
    """``error``'s message with each setting it refuses named by its flag (``FlagWord``); where the
    command takes ``--name``, a name the library refuses points at it."""
    if isinstance(error, InvalidSetting):
        return error.render(lambda name, value: FlagWord(name, value, args, typed, flags()))
    if isinstance(error, NameTaken) and getattr(args, "name_flag", False):
        return f"{error.reason}; choose another with --name"
    return str(error)
