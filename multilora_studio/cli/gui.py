"""``multilora-studio gui`` (the default command). Qt is imported only when the command runs."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from multilora_studio.cli.setting_flags import add_setting_flag
from multilora_studio.cli.shared import Subcommands, add_demo_adapters_flag
from multilora_studio.util import window_requirement


def has_display() -> bool:
    """False on a Linux machine without X11 or Wayland (or where Qt was told to render offscreen)."""
    if os.environ.get("QT_QPA_PLATFORM") in ("offscreen", "minimal"):
        return False
    if not sys.platform.startswith("linux"):
        return True
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def add_gui_command(subparsers: Subcommands) -> None:
    from multilora_studio.engine import EngineConfig  # the engine, when the command's parser is built

    parser = subparsers.add_parser(
        "gui",
        help="open the desktop window (the default command)",
        description="Open the MultiLoRA Studio window: adapter library, side-by-side compare, "
        "live monitor and the local OpenAI-compatible server.",
    )
    parser.add_argument(
        "--smoke-test",
        action="store_true",
        help="open the window (offscreen when there is no display), run one compare with the embedded "
        "model (base + library adapters) and exit 0 if it worked",
    )
    parser.add_argument("--screenshot", type=Path, default=None, help="with --smoke-test: save a PNG here")
    add_setting_flag(
        parser,
        EngineConfig,
        "device",
        help="with --smoke-test: auto, cpu, cuda or cuda:N (default: %(default)s)",
    )
    parser.add_argument(
        "--settings", type=Path, default=None, help="INI file for the window's settings (default: the user's)"
    )
    add_demo_adapters_flag(parser)
    parser.set_defaults(handler=run_gui)


def run_gui(args: argparse.Namespace) -> int:
    try:
        import PySide6  # noqa: F401
    except ImportError as error:
        raise RuntimeError(
            f"the desktop window needs PySide6: pip install '{window_requirement()}' pyqtgraph"
        ) from error
    if not has_display():
        if not args.smoke_test:
            raise RuntimeError(
                "no display found (DISPLAY / WAYLAND_DISPLAY unset); try `multilora-studio serve`"
            )
        os.environ["QT_QPA_PLATFORM"] = os.environ.get("QT_QPA_PLATFORM") or "offscreen"
    if args.smoke_test:
        from multilora_studio.gui.smoke import run_smoke_test

        return run_smoke_test(args.screenshot, device=args.device, demo_adapters=not args.no_demo_adapters)
    from multilora_studio.gui.app import run

    return run(args.settings, demo_adapters=not args.no_demo_adapters)
