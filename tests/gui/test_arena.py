"""Arena view over a real engine: names hidden on the widgets until the vote, keys 1-4 and Enter,
votes stored and ranked."""

from __future__ import annotations

import contextlib

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtWidgets import QLabel, QTextBrowser

from multilora_studio.arena import VoteStore
from multilora_studio.engine import Engine, EngineConfig
from multilora_studio.gui.arena_view import ArenaView
from multilora_studio.gui.tasks import TaskRunner
from multilora_studio.run_records import BASE
from tests.gui.conftest import save_screenshot

ADAPTERS = ("tiny-r4-qv", "tiny-r8-all")
TIMEOUT_MS = 120_000


class ServedHost(QObject):
    """What the view reads of the window's engine host: one engine on the tiny model serving ADAPTERS."""

    adaptersChanged = Signal()
    stateChanged = Signal(str)

    def __init__(self, registry, model, adapters, device) -> None:
        super().__init__()
        self.registry = registry
        self.tasks = TaskRunner(self)
        config = EngineConfig(
            model=str(model), device=device, dtype="float32", max_lora_rank=32, max_model_len=256
        )
        self.engine = Engine(config)
        for name in ADAPTERS:
            self.engine.add_adapter(name, adapters[name])

    @contextlib.contextmanager
    def lease(self):
        yield self.engine


def shown_text(view) -> str:
    """Everything the round's widgets show (the contender list aside)."""
    texts = [label.text() for label in view.findChildren(QLabel) if label.isVisible()]
    texts += [pane.toPlainText() for pane in view.findChildren(QTextBrowser)]
    return "\n".join(texts)


def test_names_stay_hidden_until_the_vote_and_the_keys_vote(
    qtbot, tiny_model_dir, engine_device, registry, tiny_adapters
):
    host = ServedHost(registry, tiny_model_dir, tiny_adapters, engine_device)
    view = ArenaView(host)  # type: ignore[arg-type]
    qtbot.addWidget(view)
    view.show()
    view.relist()
    view.setup.tick([BASE, *ADAPTERS])
    view.setup.prompts.setPlainText("Hello\nThe sky is")
    view.setup.max_tokens.setValue(6)
    qtbot.mouseClick(view.setup.start, Qt.MouseButton.LeftButton)
    session = view.session
    assert session is not None, view.banner.text
    for round_number, key in enumerate((Qt.Key.Key_1, Qt.Key.Key_2, Qt.Key.Key_3, Qt.Key.Key_4)):
        qtbot.waitUntil(lambda: session.current is not None and not session.revealed, timeout=TIMEOUT_MS)
        current = session.current
        assert (view.left.name.text(), view.right.name.text()) == ("Model A", "Model B")
        shown = shown_text(view)
        assert all(name not in shown for name in (BASE, *ADAPTERS)), shown
        assert view.left.answer.toPlainText() == current.output_left
        qtbot.keyClick(view, key)
        assert (view.left.name.text(), view.right.name.text()) == (current.left, current.right)
        assert session.votes[-1].verdict == ("a", "b", "tie", "both_bad")[round_number]
        assert not any(button.isEnabled() for button in view.vote_buttons)
        qtbot.keyClick(view, Qt.Key.Key_Return)
    assert len(VoteStore(registry.root).votes()) == 4
    assert view.board.table.rowCount() >= 2
    save_screenshot(view, "arena")
    view.stop()
    host.engine.shutdown()


def test_the_judge_votes_on_the_round_shown_apart_from_people(
    qtbot, tiny_model_dir, engine_device, registry, tiny_adapters
):
    host = ServedHost(registry, tiny_model_dir, tiny_adapters, engine_device)
    view = ArenaView(host)  # type: ignore[arg-type]
    qtbot.addWidget(view)
    view.show()
    view.relist()
    view.setup.tick(list(ADAPTERS))
    view.setup.prompts.setPlainText("Hello")
    view.setup.max_tokens.setValue(4)
    assert view.start(), view.banner.text
    session = view.session
    assert session is not None
    qtbot.waitUntil(lambda: session.current is not None, timeout=TIMEOUT_MS)
    view.judge_pick.setCurrentText(BASE)
    qtbot.mouseClick(view.judge_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: session.judge_vote is not None and view.judge_task is None, timeout=TIMEOUT_MS)
    assert "shows after yours" in view.judge_status.text() and not view.judge_button.isEnabled()
    assert all(name not in shown_text(view) for name in ADAPTERS)
    qtbot.keyClick(view, Qt.Key.Key_1)
    assert view.judge_status.text().startswith("judge:base: ")
    assert view.board.judges.text().startswith("judge:base agreed with people on")
    stored = VoteStore(registry.root).votes()
    assert sorted(vote.voter for vote in stored) == ["judge:base", "person"]
    view.stop()
    host.engine.shutdown()
