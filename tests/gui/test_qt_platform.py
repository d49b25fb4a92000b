"""Missing system libraries of Qt's xcb plugin are named, with the packages that provide them."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from multilora_studio.gui.qt_platform import (
    distribution_family,
    install_command,
    missing_libraries,
    platform_problem,
    unresolved_links,
    uses_xcb,
)

needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None or shutil.which("ldd") is None, reason="gcc/ldd")


def plugin_linked_against(folder: Path, soname: str) -> Path:
    """A real shared object that needs ``soname``, whose library is then removed from the system."""
    stub = folder / "stub.c"
    stub.write_text("int stub_symbol(void) { return 1; }\n")
    library = folder / soname
    subprocess.run(["gcc", "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", library, stub], check=True)
    user = folder / "plugin.c"
    user.write_text("int stub_symbol(void); int plugin(void) { return stub_symbol(); }\n")
    plugin = folder / "libqfake.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", plugin, user, library], check=True)
    library.unlink()
    return plugin


ABSENT = "libmultilora-absent-test.so.3"  # a soname no system has


@needs_gcc
def test_a_library_the_plugin_links_and_the_system_lacks_is_found(tmp_path: Path):
    plugin = plugin_linked_against(tmp_path, ABSENT)
    assert unresolved_links(plugin) == [ABSENT]
    assert missing_libraries(plugin)[0] == ABSENT
    problem = platform_problem(plugin, {"DISPLAY": ":0"})
    assert problem is not None and ABSENT in problem and "install" in problem
    assert platform_problem(plugin, {"DISPLAY": ":0", "QT_QPA_PLATFORM": "offscreen"}) is None


def test_missing_libraries_name_their_packages_per_distribution():
    missing = ["libxcb-icccm.so.4", "libxcb-cursor.so.0", "libxcb-randr.so.0", "libxcb-shape.so.0"]
    assert install_command(missing, "debian") == (
        "apt-get install -y libxcb-icccm4 libxcb-cursor0 libxcb-randr0 libxcb-shape0"
    )
    assert install_command(missing, "fedora") == "dnf install -y xcb-util-wm xcb-util-cursor libxcb"
    assert install_command([ABSENT], "debian") == ""


@needs_gcc
def test_nothing_is_reported_where_the_plugin_resolves(tmp_path: Path):
    stub = tmp_path / "ok.c"
    stub.write_text("int ok(void) { return 0; }\n")
    plugin = tmp_path / "libqok.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", plugin, stub], check=True)
    assert unresolved_links(plugin) == []


def test_distribution_family_from_os_release(tmp_path: Path):
    cases = {
        'ID=debian\nVERSION_ID="12"\n': "debian",
        "ID=ubuntu\nID_LIKE=debian\n": "debian",
        'ID=linuxmint\nID_LIKE="ubuntu debian"\n': "debian",
        "ID=fedora\n": "fedora",
        'ID="rocky"\nID_LIKE="rhel centos fedora"\n': "fedora",
        "ID=arch\n": "other",
    }
    for text, family in cases.items():
        release = tmp_path / "os-release"
        release.write_text(text)
        assert distribution_family(release) == family, text
    assert distribution_family(tmp_path / "absent") == "other"


def test_only_an_x11_session_uses_the_xcb_plugin():
    assert uses_xcb({"DISPLAY": ":0"})
    assert uses_xcb({"QT_QPA_PLATFORM": "xcb", "WAYLAND_DISPLAY": "wayland-0"})
    assert not uses_xcb({"DISPLAY": ":0", "QT_QPA_PLATFORM": "offscreen"})
    assert not uses_xcb({"WAYLAND_DISPLAY": "wayland-0", "XDG_SESSION_TYPE": "wayland", "DISPLAY": ":0"})
    assert not uses_xcb({})
