"""The system libraries Qt's X11 (xcb) platform plugin needs, found missing before Qt aborts without them.

Qt's own message ("Could not load the Qt platform plugin xcb ... no Qt platform plugin could be
initialized") names no library. This module reads the plugin's dynamic dependencies with
``ldd``, probes the ones Qt opens at run time (``libxcb-cursor``), and names the distribution
packages to install. ``python -m multilora_studio.gui.qt_platform`` prints the install command
to run as root (nothing when nothing is missing); the Linux installer runs it.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

# soname -> (Debian/Ubuntu package, Fedora package)
XCB_PACKAGES: dict[str, tuple[str, str]] = {
    "libxcb-cursor.so.0": ("libxcb-cursor0", "xcb-util-cursor"),
    "libxcb-icccm.so.4": ("libxcb-icccm4", "xcb-util-wm"),
    "libxcb-keysyms.so.1": ("libxcb-keysyms1", "xcb-util-keysyms"),
    "libxcb-image.so.0": ("libxcb-image0", "xcb-util-image"),
    "libxcb-render-util.so.0": ("libxcb-render-util0", "xcb-util-renderutil"),
    "libxcb-randr.so.0": ("libxcb-randr0", "libxcb"),
    "libxcb-shape.so.0": ("libxcb-shape0", "libxcb"),
    "libxcb-shm.so.0": ("libxcb-shm0", "libxcb"),
    "libxcb-sync.so.1": ("libxcb-sync1", "libxcb"),
    "libxcb-xfixes.so.0": ("libxcb-xfixes0", "libxcb"),
    "libxcb-xinerama.so.0": ("libxcb-xinerama0", "libxcb"),
    "libxcb-xkb.so.1": ("libxcb-xkb1", "libxcb"),
    "libxcb-render.so.0": ("libxcb-render0", "libxcb"),
    "libxcb.so.1": ("libxcb1", "libxcb"),
    "libX11-xcb.so.1": ("libx11-xcb1", "libX11-xcb"),
    "libX11.so.6": ("libx11-6", "libX11"),
    "libxkbcommon-x11.so.0": ("libxkbcommon-x11-0", "libxkbcommon-x11"),
    "libxkbcommon.so.0": ("libxkbcommon0", "libxkbcommon"),
    "libEGL.so.1": ("libegl1", "libglvnd-egl"),
    "libGL.so.1": ("libgl1", "libglvnd-glx"),
    "libOpenGL.so.0": ("libopengl0", "libglvnd-opengl"),
    "libfontconfig.so.1": ("libfontconfig1", "fontconfig"),
    "libfreetype.so.6": ("libfreetype6", "freetype"),
    "libdbus-1.so.3": ("libdbus-1-3", "dbus-libs"),
    "libglib-2.0.so.0": ("libglib2.0-0", "glib2"),
}
RUNTIME_LIBRARIES = ("libxcb-cursor.so.0",)  # opened by Qt >= 6.5 when the plugin starts, not linked
NOT_FOUND = re.compile(r"^\s*(\S+)\s+=>\s+not found", re.MULTILINE)


def xcb_plugin() -> Path | None:
    """The installed PySide6's xcb platform plugin, or None where PySide6 has none."""
    try:
        import PySide6
    except ImportError:
        return None
    plugin = Path(PySide6.__file__).parent / "Qt" / "plugins" / "platforms" / "libqxcb.so"
    return plugin if plugin.is_file() else None


def unresolved_links(binary: Path) -> list[str]:
    """Sonames ``ldd`` cannot resolve for ``binary`` (in the order ldd lists them, each once)."""
    if shutil.which("ldd") is None:
        return []
    listing = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=False).stdout
    return list(dict.fromkeys(NOT_FOUND.findall(listing)))


def loadable(soname: str) -> bool:
    try:
        ctypes.CDLL(soname)
    except OSError:
        return False
    return True


def missing_libraries(plugin: Path | None = None) -> list[str]:
    """Libraries the xcb plugin needs that this system lacks (empty when the window can open)."""
    plugin = plugin or xcb_plugin()
    if plugin is None:
        return []
    missing = unresolved_links(plugin)
    return missing + [name for name in RUNTIME_LIBRARIES if name not in missing and not loadable(name)]


def distribution_family(os_release: Path = Path("/etc/os-release")) -> str:
    """``debian`` (Debian, Ubuntu, Mint...), ``fedora`` (Fedora, RHEL...) or ``other``."""
    try:
        text = os_release.read_text()
    except OSError:
        return "other"
    ids: list[str] = []
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key in ("ID", "ID_LIKE"):
            ids += value.strip().strip('"').split()
    if any(name in ("debian", "ubuntu") for name in ids):
        return "debian"
    if any(name in ("fedora", "rhel", "centos") for name in ids):
        return "fedora"
    return "other"


def packages_for(missing: list[str], family: str) -> list[str]:
    """Distribution packages providing ``missing`` (the Debian names for an unknown distribution)."""
    column = 1 if family == "fedora" else 0
    return list(dict.fromkeys(XCB_PACKAGES[name][column] for name in missing if name in XCB_PACKAGES))


def install_command(missing: list[str], family: str) -> str:
    """The command (to run as root) that installs what is missing ('' when nothing is)."""
    packages = packages_for(missing, family)
    if not packages:
        return ""
    tool = "dnf install -y" if family == "fedora" else "apt-get install -y"
    return f"{tool} {' '.join(packages)}"


def uses_xcb(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether Qt will use the xcb plugin here (Linux, an X11 display, no other platform asked for)."""
    if not sys.platform.startswith("linux"):
        return False
    platform = environ.get("QT_QPA_PLATFORM", "")
    if platform:
        return platform.split(":")[0] == "xcb"
    if environ.get("WAYLAND_DISPLAY") and environ.get("XDG_SESSION_TYPE") == "wayland":
        return False
    return bool(environ.get("DISPLAY"))


def platform_problem(plugin: Path | None = None, environ: Mapping[str, str] = os.environ) -> str | None:
    """A message naming the missing libraries and how to install them, or None when the window can open."""
    if not uses_xcb(environ):
        return None
    missing = missing_libraries(plugin)
    if not missing:
        return None
    family = distribution_family()
    names = ", ".join(packages_for(missing, family) or missing)
    command = install_command(missing, family)
    how = f": sudo {command}" if command else f" (libraries {', '.join(missing)})"
    return f"the window needs system libraries this machine lacks ({names}); install them{how}"


def main() -> int:
    """Print the install command for what is missing (nothing when the window can open)."""
    command = install_command(missing_libraries(), distribution_family())
    if command:
        print(command)
    return 0


if __name__ == "__main__":
    sys.exit(main())
