"""How the HTTP endpoint is bound and guarded, validated on construction."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def _check_limit(name: str, value: object, low: int = 1, optional: bool = False) -> None:
    if optional and value is None:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}{' or None' if optional else ''}, got {value!r}")


def _strings(name: str, value: object) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise ValueError(f"{name} must be a list of strings, got {value!r}")
    if any(not isinstance(item, str) or not item.strip() for item in value):
        raise ValueError(f"{name} must hold non-empty strings, got {list(value)!r}")
    return tuple(item.strip() for item in value)


def is_loopback(host: str) -> bool:
    """True for names and addresses that only this machine can reach."""
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass
class ServerConfig:
    """Bind address, API keys and limits of the endpoint.

    ``port=0`` picks a free port. Limits set to None are off; the in-flight bound is
    always on so memory stays bounded however many clients connect.
    """

    host: str = "127.0.0.1"
    port: int = 8000
    api_keys: tuple[str, ...] = ()
    max_concurrent_per_key: int | None = None
    tokens_per_minute_per_key: int | None = None
    max_in_flight: int = 256
    max_sequences_per_request: int = 256  # prompts x n; lm-evaluation-harness batches fit
    max_body_bytes: int = 1 << 20
    allowed_hosts: tuple[str, ...] = ()
    cors_origins: tuple[str, ...] = ()
    request_log_size: int = 1000
    graceful_shutdown_s: int = 2
    allow_hub_adapters: bool = False  # pull an unknown ``org/name[@rev]`` model from the Hub
    hub_pull_timeout_s: int = 120  # how long a request waits for that pull
    allow_special_tokens_in_content: bool = (
        False  # trusted clients only: message text may spell control tokens
    )

    def __post_init__(self) -> None:
        if not isinstance(self.host, str) or not self.host.strip():
            raise ValueError(f"host must be an address or host name, got {self.host!r}")
        _check_limit("port", self.port, 0)
        if self.port > 65535:
            raise ValueError(f"port must be between 0 and 65535, got {self.port}")
        self.api_keys = _strings("api_keys", self.api_keys)
        if any(len(key) < 8 for key in self.api_keys):
            raise ValueError("API keys must be at least 8 characters long")
        _check_limit("max_concurrent_per_key", self.max_concurrent_per_key, optional=True)
        _check_limit("tokens_per_minute_per_key", self.tokens_per_minute_per_key, optional=True)
        _check_limit("max_in_flight", self.max_in_flight)
        _check_limit("max_sequences_per_request", self.max_sequences_per_request)
        _check_limit("max_body_bytes", self.max_body_bytes, 256)
        self.allowed_hosts = _strings("allowed_hosts", self.allowed_hosts)
        self.cors_origins = _strings("cors_origins", self.cors_origins)
        _check_limit("request_log_size", self.request_log_size)
        _check_limit("graceful_shutdown_s", self.graceful_shutdown_s, 0)
        if not isinstance(self.allow_hub_adapters, bool):
            raise ValueError(f"allow_hub_adapters must be true or false, got {self.allow_hub_adapters!r}")
        _check_limit("hub_pull_timeout_s", self.hub_pull_timeout_s)
        allow = self.allow_special_tokens_in_content
        if not isinstance(allow, bool):
            raise ValueError(f"allow_special_tokens_in_content must be true or false, got {allow!r}")

    @property
    def loopback(self) -> bool:
        return is_loopback(self.host)
