"""Server view: toggle the OpenAI-compatible endpoint (every base of the window and its adapters),
its address and key, examples, the live request log."""

from __future__ import annotations

import json
import secrets
import time

from PySide6.QtCore import Qt
from PySide6.QtGui import QFontDatabase
from PySide6.QtWidgets import (
    QApplication,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from multilora_studio.engine.settings import declaration
from multilora_studio.gui.engine_host import EngineHost
from multilora_studio.gui.key_store import load_api_key, save_api_key
from multilora_studio.gui.preferences import Preferences
from multilora_studio.gui.server_control import OFF, ON, ServerControl
from multilora_studio.gui.setting_form import spin_box
from multilora_studio.gui.widgets import MessageBanner, format_ms
from multilora_studio.server import RequestRecord, ServerConfig

LOG_COLUMNS = (
    "Time",
    "Route",
    "Model",
    "Key",
    "Status",
    "Prompt tok",
    "Completion tok",
    "Latency",
    "TTFT",
    "Error",
)
MAX_LOG_ROWS = 1000
DEFAULT_PORT = ServerConfig().port  # serve --port's default too
LEGACY_KEY_PREF = "server/api_key"  # earlier versions kept the key here, in plain text


def curl_example(url: str, model: str, api_key: str) -> str:
    body = {"model": model, "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 64}
    auth = f' \\\n  -H "Authorization: Bearer {api_key}"' if api_key else ""
    return (
        f"curl {url}/v1/chat/completions \\\n"
        f'  -H "Content-Type: application/json"{auth} \\\n'
        f"  -d '{json.dumps(body)}'"
    )


def python_example(url: str, model: str, api_key: str) -> str:
    return (
        "from openai import OpenAI\n\n"
        f'client = OpenAI(base_url="{url}/v1", api_key="{api_key or "unused"}")\n'
        "reply = client.chat.completions.create(\n"
        f'    model="{model}",\n'
        '    messages=[{"role": "user", "content": "Hello!"}],\n'
        "    max_tokens=64,\n"
        ")\n"
        "print(reply.choices[0].message.content)\n"
    )


class ServerView(QWidget):
    """See the module docstring; the server runs over the window's engine."""

    def __init__(self, host: EngineHost, control: ServerControl, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.host = host
        self.control = control
        self.banner = MessageBanner()
        self._stored_key = ""
        top = QHBoxLayout()
        top.addLayout(self._address_form(), 1)
        top.addLayout(self._examples(), 2)
        layout = QVBoxLayout(self)
        layout.addWidget(self.banner)
        layout.addLayout(top)
        layout.addWidget(self._log_box(), 1)
        control.stateChanged.connect(self._state_changed)
        control.failed.connect(self.banner.show_message)
        control.requestLogged.connect(self.add_record)
        host.adaptersChanged.connect(self._show_examples)
        host.stateChanged.connect(lambda state: self._state_changed(control.state))
        for edit in (self.host_edit, self.api_key):
            edit.textChanged.connect(self._show_examples)
        self.port.valueChanged.connect(self._show_examples)
        self._state_changed(control.state)

    def _address_form(self) -> QFormLayout:
        """Host, port, API key, the toggle and the base URL."""
        self.host_edit = QLineEdit(ServerConfig.host)
        self.port = spin_box(declaration(ServerConfig, "port"), "any free port")
        self.port.setValue(DEFAULT_PORT)
        self.api_key = QLineEdit(placeholderText="optional; at least 8 characters")
        self.api_key.setEchoMode(QLineEdit.EchoMode.PasswordEchoOnEdit)
        self.key_note = QLabel()  # says when no OS keyring can keep the key
        self.key_note.setWordWrap(True)
        generate = QPushButton("Generate")
        generate.clicked.connect(lambda: self.api_key.setText("sk-studio-" + secrets.token_urlsafe(18)))
        self.toggle = QPushButton("Start server")
        self.toggle.setCheckable(True)
        self.toggle.clicked.connect(self._toggled)
        self.state_label = QLabel("stopped")
        self.url = QLineEdit(readOnly=True)
        copy_url = QPushButton("Copy")
        copy_url.clicked.connect(lambda: QApplication.clipboard().setText(self.url.text()))
        form = QFormLayout()
        form.addRow("Host", self.host_edit)
        form.addRow("Port", self.port)
        form.addRow("API key", row_of(self.api_key, generate))
        form.addRow("", self.key_note)
        form.addRow(self.toggle, self.state_label)
        form.addRow("Base URL", row_of(self.url, copy_url))
        return form

    def _examples(self) -> QHBoxLayout:
        """The curl and Python examples, each with its Copy button."""
        self.curl = QPlainTextEdit(readOnly=True)
        self.python = QPlainTextEdit(readOnly=True)
        mono = QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont)
        examples = QHBoxLayout()
        for title, editor in (("curl", self.curl), ("Python (openai)", self.python)):
            editor.setFont(mono)
            editor.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
            box = QGroupBox(title)
            box_layout = QVBoxLayout(box)
            box_layout.addWidget(editor)
            copy = QPushButton("Copy")
            copy.clicked.connect(
                lambda checked=False, e=editor: QApplication.clipboard().setText(e.toPlainText())
            )
            box_layout.addWidget(copy, 0, Qt.AlignmentFlag.AlignRight)
            examples.addWidget(box)
        return examples

    def _log_box(self) -> QGroupBox:
        """The request log, newest first."""
        self.log = QTableWidget(0, len(LOG_COLUMNS))
        self.log.setHorizontalHeaderLabels(LOG_COLUMNS)
        self.log.verticalHeader().hide()
        self.log.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.log.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.log.horizontalHeader().setStretchLastSection(True)
        log_box = QGroupBox("Requests (newest first)")
        QVBoxLayout(log_box).addWidget(self.log)
        return log_box

    def server_config(self) -> ServerConfig:
        keys = (self.api_key.text().strip(),) if self.api_key.text().strip() else ()
        return ServerConfig(host=self.host_edit.text().strip(), port=self.port.value(), api_keys=keys)

    def start(self) -> bool:
        pool = self.host.pool
        if pool is None:
            self.banner.show_message("The engine is not ready yet (see the status bar).", "warning")
            return False
        try:
            config = self.server_config()
        except ValueError as error:
            self.banner.show_message(str(error))
            return False
        self.banner.clear()
        return self.control.start(pool, config) is not None

    def stop(self) -> bool:
        return self.control.stop() is not None

    def _toggled(self, checked: bool) -> None:
        started = self.start() if checked else self.stop()
        if not started:
            self._state_changed(self.control.state)

    def _state_changed(self, state: str) -> None:
        on = state == ON
        self.toggle.setChecked(state != OFF)
        self.toggle.setText("Stop server" if state != OFF else "Start server")
        self.toggle.setEnabled(state in (ON, OFF) and (on or self.host.pool is not None))
        for edit in (self.host_edit, self.port, self.api_key):
            edit.setEnabled(state == OFF)
        texts = {"off": "stopped", "starting": "starting…", "on": "serving", "stopping": "stopping…"}
        self.state_label.setText(texts.get(state, state))
        self.url.setText(f"{self.control.url}/v1" if on else "")
        self._show_examples()

    def _base_url(self) -> str:
        if self.control.url:
            return self.control.url
        host = self.host_edit.text().strip() or "127.0.0.1"
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port.value() or DEFAULT_PORT}"

    def _show_examples(self) -> None:
        pool = self.host.pool
        model = "ADAPTER"
        if pool is not None:
            names = sorted(pool.adapters_of(pool.primary))
            model = names[0] if names else pool.primary
        key = self.api_key.text().strip()
        self.curl.setPlainText(curl_example(self._base_url(), model, key))
        self.python.setPlainText(python_example(self._base_url(), model, key))

    def add_record(self, record: RequestRecord) -> None:
        """Show one served request at the top of the log (GUI thread)."""
        cells = (
            time.strftime("%H:%M:%S", time.localtime(record.time)),
            record.route + (" (stream)" if record.stream else ""),
            record.model if record.adapter is None else record.adapter,
            record.api_key,
            str(record.status),
            str(record.prompt_tokens),
            str(record.completion_tokens),
            format_ms(record.latency_s),
            format_ms(record.ttft_s),
            record.error or "",
        )
        self.log.insertRow(0)
        for column, text in enumerate(cells):
            self.log.setItem(0, column, QTableWidgetItem(text))
        if self.log.rowCount() > MAX_LOG_ROWS:
            self.log.removeRow(self.log.rowCount() - 1)

    def log_rows(self) -> list[dict[str, str]]:
        """The log's cells by column title, newest first."""
        rows = []
        for row in range(self.log.rowCount()):
            items = [self.log.item(row, column) for column in range(len(LOG_COLUMNS))]
            rows.append(
                {title: item.text() if item else "" for title, item in zip(LOG_COLUMNS, items, strict=True)}
            )
        return rows

    def saved_widgets(self) -> list[QWidget]:
        """The inputs ``save_state`` records (the window saves again when any of them changes)."""
        return [self.host_edit, self.port, self.api_key]

    def save_state(self, prefs: Preferences) -> None:
        """Host and port to the preferences; the API key to the OS keyring (never the preferences)."""
        prefs.set("server/host", self.host_edit.text().strip())
        prefs.set("server/port", self.port.value())
        key = self.api_key.text().strip()
        if key != self._stored_key:
            problem = save_api_key(key)
            self._stored_key = key
            self.key_note.setText(f"Note: {problem}." if problem and key else "")

    def restore_state(self, prefs: Preferences) -> None:
        self.host_edit.setText(prefs.get("server/host", "127.0.0.1"))
        self.port.setValue(prefs.get("server/port", DEFAULT_PORT))
        legacy = prefs.get(LEGACY_KEY_PREF, "")  # where earlier versions kept it, in plain text
        if legacy:
            prefs.remove(LEGACY_KEY_PREF)
            problem = save_api_key(legacy)
            self.key_note.setText(f"Note: {problem}." if problem else "")
        self._stored_key = legacy or load_api_key()
        self.api_key.setText(self._stored_key)


def row_of(field: QWidget, button: QPushButton) -> QHBoxLayout:
    """A field that takes the room, and its button."""
    row = QHBoxLayout()
    row.addWidget(field, 1)
    row.addWidget(button)
    return row
