"""The endpoint's API key lives in an encrypted keyring, never in the preferences file."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import keyring
import pytest
from keyring.backends.fail import Keyring as NoKeyring
from keyrings.alt.file import EncryptedKeyring, PlaintextKeyring

from multilora_studio.gui.key_store import ACCOUNT, SERVICE, load_api_key, save_api_key, secure_backend
from multilora_studio.gui.server_view import LEGACY_KEY_PREF

KEY = "sk-studio-a-secret-for-the-test"


@pytest.fixture
def encrypted(tmp_path: Path) -> Iterator[EncryptedKeyring]:
    """An encrypted file keyring (pycryptodome) standing in for the OS keyring."""
    backend = EncryptedKeyring()
    backend.file_path = str(tmp_path / "keyring.cfg")
    backend.keyring_key = "the keyring's own password"
    before = keyring.get_keyring()
    keyring.set_keyring(backend)
    yield backend
    keyring.set_keyring(before)


def test_the_key_goes_to_the_keyring_and_back_into_a_new_window(qtbot, open_window, settings_file, encrypted):
    window = open_window()
    view = window.server
    view.api_key.setText(KEY)
    window.save_state()
    assert encrypted.get_password(SERVICE, ACCOUNT) == KEY
    assert KEY not in settings_file.read_text() and KEY not in Path(encrypted.file_path).read_text()
    assert view.key_note.text() == ""
    window.close()
    again = open_window()
    assert again.server.api_key.text() == KEY
    again.server.api_key.clear()
    again.save_state()
    assert encrypted.get_password(SERVICE, ACCOUNT) is None


def test_a_key_from_an_earlier_version_moves_out_of_the_preferences(
    qtbot, open_window, make_prefs, settings_file, encrypted
):
    prefs = make_prefs()
    prefs.set(LEGACY_KEY_PREF, KEY)
    prefs.sync()
    window = open_window()
    assert window.server.api_key.text() == KEY
    window.save_state()
    assert encrypted.get_password(SERVICE, ACCOUNT) == KEY and KEY not in settings_file.read_text()


@pytest.mark.parametrize("backend", [NoKeyring, PlaintextKeyring])
def test_without_an_encrypting_keyring_the_key_is_kept_for_the_session_only(
    qtbot, open_window, settings_file, tmp_path, backend
):
    chosen = backend()
    if isinstance(chosen, PlaintextKeyring):
        chosen.file_path = str(tmp_path / "plain.cfg")
    before = keyring.get_keyring()
    keyring.set_keyring(chosen)
    try:
        assert secure_backend() is None
        window = open_window()
        view = window.server
        view.api_key.setText(KEY)
        window.save_state()
        assert "kept for this session only" in view.key_note.text()
        assert view.api_key.text() == KEY  # still usable now
        assert KEY not in settings_file.read_text()
        assert not (tmp_path / "plain.cfg").exists()
        assert save_api_key(KEY) is not None and load_api_key() == ""
    finally:
        keyring.set_keyring(before)
