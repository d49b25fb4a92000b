"""How the HTTP endpoint is bound and guarded, validated on construction."""

from __future__ import annotations

import math
from dataclasses import dataclass

from multilora_studio.server.api_keys import ApiKey, named_keys
from multilora_studio.server.exposure import bound_host_names, is_loopback


def _check_limit(name: str, value: object, low: int = 1, optional: bool = False) -> None:
    if optional and value is None:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}{' or None' if optional else ''}, got {value!r}")


def _check_seconds(name: str, value: object) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValueError(f"{name} must be a number of seconds > 0, got {value!r}")


def _strings(name: str, value: object) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise ValueError(f"{name} must be a list of strings, got {value!r}")
    if any(not isinstance(item, str) or not item.strip() for item in value):
        raise ValueError(f"{name} must hold non-empty strings, got {list(value)!r}")
    return tuple(item.strip() for item in value)


@dataclass
class ServerConfig:
    """Bind address, API keys and limits of the endpoint.

    ``port=0`` picks a free port. Limits set to None are off; the in-flight bound is
    always on so memory stays bounded however many clients connect. ``api_keys`` holds
    strings (admin keys) or ``ApiKey`` entries with a role and models. An address other
    machines can reach needs a key unless ``allow_no_key`` says the network is trusted.
    """

    host: str = "127.0.0.1"
    port: int = 8000
    api_keys: tuple[str | ApiKey, ...] = ()
    allow_no_key: bool = False  # serve a non-loopback address without keys (a trusted network)
    max_concurrent_per_key: int | None = None
    tokens_per_minute_per_key: int | None = None
    max_in_flight: int = 256
    max_sequences_per_request: int = 256  # prompts x n; lm-evaluation-harness batches fit
    max_body_bytes: int = 1 << 20
    allowed_hosts: tuple[str, ...] = ()
    cors_origins: tuple[str, ...] = ()
    request_log_size: int = 1000
    graceful_shutdown_s: int = 2
    allow_hub_adapters: bool = False  # an admin's request for an unknown ``org/name[@rev]`` pulls it
    hub_pull_timeout_s: int = 120  # how long a request waits for that pull
    hub_pulls_at_once: int = 2  # Hub pulls running at once (on threads of their own)
    hub_pull_limit: int = 16  # adapters requests may pull from the Hub while this server runs
    hub_pull_max_bytes: int = 4 << 30  # the files of one pulled adapter
    header_timeout_s: float = 10.0  # from a connection's first byte (or its opening) to a whole request head
    body_timeout_s: float = 60.0  # from the request head to the end of its body, however steadily it arrives
    max_connections_per_client: int = 64  # open connections from one client address, loopback included
    max_connections: int = 512  # open connections from all addresses together
    allow_special_tokens_in_content: bool = False  # trusted clients: message text may spell control tokens

    def __post_init__(self) -> None:
        if not isinstance(self.host, str) or not self.host.strip():
            raise ValueError(f"host must be an address or host name, got {self.host!r}")
        _check_limit("port", self.port, 0)
        if self.port > 65535:
            raise ValueError(f"port must be between 0 and 65535, got {self.port}")
        if isinstance(self.api_keys, str) or not isinstance(self.api_keys, (list, tuple)):
            raise ValueError(f"api_keys must be a list of keys, got {self.api_keys!r}")
        self.api_keys = named_keys(self.api_keys)
        if not isinstance(self.allow_no_key, bool):
            raise ValueError(f"allow_no_key must be true or false, got {self.allow_no_key!r}")
        if not self.loopback and not self.api_keys and not self.allow_no_key:
            raise ValueError(
                f"{self.host} can be reached from other machines: set an API key "
                "(or allow serving without one on a trusted network)"
            )
        _check_limit("max_concurrent_per_key", self.max_concurrent_per_key, optional=True)
        _check_limit("tokens_per_minute_per_key", self.tokens_per_minute_per_key, optional=True)
        _check_limit("max_in_flight", self.max_in_flight)
        _check_limit("max_sequences_per_request", self.max_sequences_per_request)
        _check_limit("max_body_bytes", self.max_body_bytes, 256)
        self.allowed_hosts = _strings("allowed_hosts", self.allowed_hosts)
        self.cors_origins = _strings("cors_origins", self.cors_origins)
        if "*" in self.cors_origins and not self.api_keys:
            raise ValueError(
                "allowed origins '*' let every web page the user opens call this server: set an API key, "
                "or name the origins"
            )
        _check_limit("request_log_size", self.request_log_size)
        _check_limit("graceful_shutdown_s", self.graceful_shutdown_s, 0)
        if not isinstance(self.allow_hub_adapters, bool):
            raise ValueError(f"allow_hub_adapters must be true or false, got {self.allow_hub_adapters!r}")
        _check_limit("hub_pull_timeout_s", self.hub_pull_timeout_s)
        _check_limit("hub_pulls_at_once", self.hub_pulls_at_once)
        _check_limit("hub_pull_limit", self.hub_pull_limit)
        _check_limit("hub_pull_max_bytes", self.hub_pull_max_bytes)
        _check_seconds("header_timeout_s", self.header_timeout_s)
        _check_seconds("body_timeout_s", self.body_timeout_s)
        _check_limit("max_connections_per_client", self.max_connections_per_client)
        _check_limit("max_connections", self.max_connections)
        allow = self.allow_special_tokens_in_content
        if not isinstance(allow, bool):
            raise ValueError(f"allow_special_tokens_in_content must be true or false, got {allow!r}")

    @property
    def loopback(self) -> bool:
        return is_loopback(self.host)

    @property
    def keys(self) -> tuple[ApiKey, ...]:
        """``api_keys`` as named ``ApiKey`` entries (normalised on construction)."""
        return tuple(key for key in self.api_keys if isinstance(key, ApiKey))

    def host_names(self) -> tuple[str, ...]:
        """The Host header names accepted: the bound address's own names plus ``allowed_hosts``."""
        return tuple(dict.fromkeys([*bound_host_names(self.host), *(h.lower() for h in self.allowed_hosts)]))
