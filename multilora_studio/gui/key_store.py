"""The endpoint's API key in the operating system's keyring, never in the preferences file.

Where no keyring keeps secrets encrypted (no Secret Service on a headless Linux, only a
plain-text file backend), the key is kept for the running session only and the window says so.
"""

from __future__ import annotations

import logging

import keyring
from keyring.backend import KeyringBackend
from keyring.errors import KeyringError

log = logging.getLogger(__name__)

SERVICE = "multilora-studio"
ACCOUNT = "server-api-key"
# backends that keep nothing, or keep it in plain text
INSECURE_BACKENDS = ("keyring.backends.fail", "keyring.backends.null", "keyrings.alt.file.PlaintextKeyring")


def secure_backend() -> KeyringBackend | None:
    """The keyring in use when it keeps secrets encrypted, else None."""
    backend = keyring.get_keyring()
    name = f"{type(backend).__module__}.{type(backend).__qualname__}"
    if any(name.startswith(insecure) for insecure in INSECURE_BACKENDS) or backend.priority <= 0:
        return None
    return backend


def save_api_key(key: str) -> str | None:
    """Store ``key`` (or delete it when empty); a sentence for the user when it could not be kept."""
    backend = secure_backend()
    if backend is None:
        return "no OS keyring is available, so the API key is kept for this session only"
    try:
        if key:
            backend.set_password(SERVICE, ACCOUNT, key)
        elif backend.get_password(SERVICE, ACCOUNT) is not None:
            backend.delete_password(SERVICE, ACCOUNT)
    except KeyringError as error:
        log.warning("could not store the API key in %s: %s", type(backend).__name__, error)
        return f"the OS keyring refused the API key ({error}); it is kept for this session only"
    return None


def load_api_key() -> str:
    """The stored key, or "" (none stored, or no usable keyring)."""
    backend = secure_backend()
    if backend is None:
        return ""
    try:
        return backend.get_password(SERVICE, ACCOUNT) or ""
    except KeyringError as error:
        log.warning("could not read the API key from %s: %s", type(backend).__name__, error)
        return ""
