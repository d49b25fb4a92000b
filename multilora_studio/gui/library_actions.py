"""The Library's action controls: the selected adapter's buttons (what each offers comes from
``workflows.library_selection``), and the questions an action asks before it runs."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from PySide6.QtWidgets import QFileDialog, QHBoxLayout, QInputDialog, QMessageBox, QPushButton, QWidget

from multilora_studio.adapters.registry import Registry
from multilora_studio.gui.engine_host import EngineHost
from multilora_studio.gui.tasks import Task
from multilora_studio.gui.workflows.library_selection import SelectedActions, lifecycle_action, warm_list


class SelectedButtons:
    """Pin, Rename, Add alias, Retire, Archive, Warm at start, Warm on alias, Remove."""

    def __init__(self) -> None:
        self.pin_button = QPushButton("Pin")
        self.rename_button = QPushButton("Rename…")
        self.alias_button = QPushButton("Add alias…")
        self.retire_button = QPushButton("Retire")
        self.retire_button.setToolTip("Retire: listed, not served. Reactivate: served again")
        self.archive_button = QPushButton("Archive")
        self.archive_button.setToolTip("Archive: the files packed into one archive, the folder freed")
        self.warm_button = QPushButton("Warm at start")
        self.warm_button.setToolTip("Read into host RAM at every engine start, before its first request")
        self.alias_warm_button = QPushButton("Warm on alias…")
        self.alias_warm_button.setToolTip(
            "Adapters read into host RAM when a request first uses one of its aliases"
        )
        self.remove_button = QPushButton("Remove")

    def buttons(self) -> list[QPushButton]:
        return [
            self.pin_button,
            self.rename_button,
            self.alias_button,
            self.retire_button,
            self.archive_button,
            self.warm_button,
            self.alias_warm_button,
            self.remove_button,
        ]

    def show(self, actions: SelectedActions) -> None:
        for button in self.buttons():
            button.setEnabled(actions.selected)
        self.pin_button.setText(actions.pin)
        self.retire_button.setText(actions.retire)
        self.retire_button.setEnabled(actions.retire_enabled)
        self.archive_button.setText(actions.archive)
        self.warm_button.setText(actions.warm)
        self.alias_warm_button.setEnabled(actions.alias_warm_enabled)

    def lay_out(self, row: QHBoxLayout) -> None:
        """One row (the window's width is small)."""
        for button in self.buttons():
            row.addWidget(button)
        row.addStretch(1)


class Library(Protocol):
    """What the questions ask of the Library view: its selection and its actions."""

    host: EngineHost
    registry: Registry

    def selected_name(self) -> str | None: ...

    def import_folder(
        self, folder: str | Path, name: str | None = None, base: str | None = None
    ) -> Task | None: ...

    def remove(self, name: str) -> Task: ...

    def set_pinned(self, name: str, pinned: bool) -> Task: ...

    def rename(self, name: str, new_name: str) -> Task: ...

    def change_state(self, name: str, action: str, reason: str = "") -> Task: ...

    def set_warm(self, name: str, warm: bool) -> Task: ...

    def add_alias(self, name: str, alias: str) -> Task: ...

    def set_alias_warm(self, alias: str, names: list[str]) -> Task: ...


class LibraryQuestions:
    """Each action's questions (a folder, a name, a reason, a confirmation), asked in dialogs over
    ``parent``; the answers go to ``library``'s actions."""

    def __init__(self, library: Library, parent: QWidget, buttons: SelectedButtons) -> None:
        self.library = library
        self.parent = parent
        buttons.pin_button.clicked.connect(self.toggle_pin)
        buttons.rename_button.clicked.connect(self.rename)
        buttons.alias_button.clicked.connect(self.add_alias)
        buttons.retire_button.clicked.connect(lambda: self.change_state(buttons.retire_button.text()))
        buttons.archive_button.clicked.connect(lambda: self.change_state(buttons.archive_button.text()))
        buttons.warm_button.clicked.connect(self.toggle_warm)
        buttons.alias_warm_button.clicked.connect(self.alias_warm)
        buttons.remove_button.clicked.connect(self.remove)

    def import_folder(self) -> None:
        parent = self.parent
        folder = QFileDialog.getExistingDirectory(parent, "Import a PEFT adapter folder")
        if not folder:
            return
        name, ok = QInputDialog.getText(
            parent, "Import adapter", "Name in the library:", text=Path(folder).name
        )
        if not ok:
            return
        pool = self.library.host.pool
        base = None
        if pool is not None and len(pool.names) > 1:
            base, ok = QInputDialog.getItem(
                parent, "Import adapter", "Base model it was trained on:", pool.names, 0, False
            )
            if not ok:
                return
        self.library.import_folder(folder, name.strip() or None, base)

    def change_state(self, label: str) -> None:
        name = self.library.selected_name()
        if name is None:
            return
        reason, ok = QInputDialog.getText(self.parent, f"{label} {name}", "Reason (kept in the history):")
        if ok:
            self.library.change_state(name, lifecycle_action(label), reason.strip())

    def toggle_warm(self) -> None:
        name = self.library.selected_name()
        record = self.library.registry.find(name) if name else None
        if record is not None:
            self.library.set_warm(record.name, not record.warm)

    def toggle_pin(self) -> None:
        name = self.library.selected_name()
        record = self.library.registry.find(name) if name else None
        if record is not None:
            self.library.set_pinned(record.name, not record.pinned)

    def rename(self) -> None:
        name = self.library.selected_name()
        if name is None:
            return
        new_name, ok = QInputDialog.getText(self.parent, "Rename adapter", f"New name for {name}:", text=name)
        if ok:
            self.library.rename(name, new_name)

    def add_alias(self) -> None:
        name = self.library.selected_name()
        if name is None:
            return
        alias, ok = QInputDialog.getText(self.parent, "Add alias", f"Another name for {name}:")
        if ok:
            self.library.add_alias(name, alias)

    def alias_warm(self) -> None:
        name = self.library.selected_name()
        record = self.library.registry.find(name) if name else None
        if record is None or not record.aliases:
            return
        alias = record.aliases[0]
        if len(record.aliases) > 1:
            alias, ok = QInputDialog.getItem(
                self.parent, "Warm on alias", "Alias:", list(record.aliases), 0, False
            )
            if not ok:
                return
        listed = ", ".join(dict(record.alias_warm).get(alias, ()))
        text, ok = QInputDialog.getText(
            self.parent,
            "Warm on alias",
            f"Adapters read into host RAM when a request first uses {alias} (comma-separated):",
            text=listed,
        )
        if ok:
            self.library.set_alias_warm(alias, warm_list(text))

    def remove(self) -> None:
        name = self.library.selected_name()
        if name is None:
            return
        answer = QMessageBox.question(
            self.parent,
            "Remove adapter",
            f"Remove {name!r} from the library? An imported copy is deleted; a Hub download stays in "
            "the Hugging Face cache.",
        )
        if answer == QMessageBox.StandardButton.Yes:
            self.library.remove(name)
