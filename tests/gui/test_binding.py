"""The Qt binding must not lose references to None (it aborts the window on Python < 3.12)."""

from __future__ import annotations

import sys
from importlib.metadata import requires

from packaging.requirements import Requirement
from PySide6.QtWidgets import QLabel

from multilora_studio.gui.binding_check import binding_problem, none_references_lost
from multilora_studio.util import window_requirement

CALLS = 5_000


def test_thousands_of_qt_calls_leave_the_references_to_none_alone(qapp):
    label = QLabel()
    before = sys.getrefcount(None)
    for index in range(CALLS):
        label.setText(str(index))  # returns nothing: the defective binding drops one reference here
        label.setVisible(False)
    lost = before - sys.getrefcount(None)
    assert lost < CALLS // 10, f"{lost} references to None lost over {2 * CALLS} Qt calls"
    assert none_references_lost(CALLS) < CALLS // 10
    assert binding_problem() is None


def test_the_dependencies_exclude_the_leaking_binding_below_python_3_12():
    wanted = [Requirement(r) for r in requires("multilora-studio") or [] if r.startswith("PySide6")]
    for python, leaking_allowed in (("3.10", False), ("3.11", False), ("3.12", True), ("3.13", True)):
        environment = {"python_version": python, "extra": ""}
        active = [r for r in wanted if r.marker is None or r.marker.evaluate(environment)]
        assert active, f"no PySide6 requirement for Python {python}"
        assert all(r.specifier.contains("6.11.3") for r in active)
        assert all(r.specifier.contains("6.12.0") for r in active) == leaking_allowed, python


def test_the_install_hint_asks_for_what_the_dependencies_ask_on_this_python():
    wanted = [Requirement(r) for r in requires("multilora-studio") or [] if r.startswith("PySide6")]
    active = [r for r in wanted if r.marker is None or r.marker.evaluate({"extra": ""})]
    hint = Requirement(window_requirement())
    assert [str(r.specifier) for r in active] == [str(hint.specifier)]
