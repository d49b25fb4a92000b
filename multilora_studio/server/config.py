"""How the HTTP endpoint is bound and guarded, validated on construction."""

from __future__ import annotations

import math
from dataclasses import dataclass

from multilora_studio.engine.settings import Declared, declared, setting
from multilora_studio.server.api_keys import ApiKey, named_keys
from multilora_studio.server.exposure import bound_host_names, is_loopback


def _checked(item: Declared, value: object) -> object:
    """``value`` of the declared field ``item`` checked in the server's words (ValueError naming
    the field), lists as tuples of stripped strings."""
    name, low, high = item.name, item.setting.low, item.setting.high
    if item.kind is bool and not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false, got {value!r}")
    if item.kind is int and not (item.optional and value is None):
        if not isinstance(value, int) or isinstance(value, bool) or (low is not None and value < low):
            alone = " or None" if item.optional else ""
            raise ValueError(f"{name} must be an integer >= {low}{alone}, got {value!r}")
        if high is not None and value > high:
            raise ValueError(f"{name} must be between {low} and {high}, got {value}")
    if item.kind is float and (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValueError(f"{name} must be a number of seconds > 0, got {value!r}")
    if item.kind is tuple:
        if isinstance(value, str) or not isinstance(value, (list, tuple)):
            raise ValueError(f"{name} must be a list of strings, got {value!r}")
        if any(not isinstance(entry, str) or not entry.strip() for entry in value):
            raise ValueError(f"{name} must hold non-empty strings, got {list(value)!r}")
        return tuple(entry.strip() for entry in value)
    return value


@dataclass
class ServerConfig:
    """Bind address, API keys and limits of the endpoint.

    ``port=0`` picks a free port. Limits set to None are off; the in-flight bound is
    always on so memory stays bounded however many clients connect. ``api_keys`` holds
    strings (admin keys) or ``ApiKey`` entries with a role and models. An address other
    machines can reach needs a key unless ``allow_no_key`` says the network is trusted.
    """

    host: str = setting("127.0.0.1", flag="--host", help="address to bind (default: loopback only)")
    port: int = setting(8000, flag="--port", help="TCP port (0: any free port)", low=0, high=65535)
    api_keys: tuple[str | ApiKey, ...] = ()  # flags of their own: --api-key, --user-key, --keys-file
    # serve a non-loopback address without keys (a trusted network)
    allow_no_key: bool = setting(
        False,
        flag="--allow-no-key",
        help="serve a non-loopback --host without any key (only on a network you trust)",
    )
    max_concurrent_per_key: int | None = setting(
        None, flag="--max-concurrent-per-key", help="open requests per key", low=1
    )
    tokens_per_minute_per_key: int | None = setting(
        None, flag="--tokens-per-minute", help="token budget per key", low=1
    )
    max_in_flight: int = setting(256, flag="--max-in-flight", help="engine requests the server holds", low=1)
    # prompts x n; lm-evaluation-harness batches fit
    max_sequences_per_request: int = setting(
        256, flag="--max-sequences-per-request", help="prompts x n one request may ask for", low=1
    )
    max_body_bytes: int = setting(1 << 20, flag="--max-body-bytes", help="largest request body", low=256)
    allowed_hosts: tuple[str, ...] = setting(
        (),
        flag="--allowed-hosts",
        metavar="HOST",
        help="Host header names to accept besides the bound address's own (its addresses, the "
        "machine's name, loopback), e.g. a DNS name clients use",
    )
    cors_origins: tuple[str, ...] = setting(
        (), flag="--allowed-origins", metavar="ORIGIN", help="enable CORS for these origins"
    )
    request_log_size: int = setting(1000, low=1)
    graceful_shutdown_s: int = setting(2, low=0)
    # an admin's request for an unknown ``org/name[@rev]`` pulls it
    allow_hub_adapters: bool = setting(
        False,
        flag="--allow-hub-adapters",
        help="an admin key's request whose model is an unserved ORG/NAME[@REV] pulls that adapter "
        "from the Hub (HF_ENDPOINT), validates it, adds it to the library and serves it",
    )
    hub_pull_timeout_s: int = setting(  # how long a request waits for that pull
        120,
        flag="--hub-pull-timeout",
        metavar="SECONDS",
        help="how long a request waits for its Hub adapter's pull before a 504",
        low=1,
    )
    hub_pulls_at_once: int = setting(  # Hub pulls running at once (on threads of their own)
        2,
        flag="--hub-pulls-at-once",
        metavar="N",
        help="Hub pulls that may run at once; a request for another gets 429",
        low=1,
    )
    hub_pull_limit: int = setting(  # adapters requests may pull from the Hub while this server runs
        16,
        flag="--hub-pull-limit",
        metavar="N",
        help="adapters requests may pull from the Hub while the server runs; past it a 403",
        low=1,
    )
    hub_pull_max_bytes: int = setting(  # the files of one pulled adapter
        4 << 30,
        flag="--hub-pull-max-bytes",
        metavar="BYTES",
        help="largest adapter (all its files) a request may pull; a larger one is a 413",
        low=1,
    )
    # from a connection's first byte (or its opening) to a whole request head
    header_timeout_s: float = setting(
        10.0,
        flag="--header-timeout",
        metavar="SECONDS",
        help="close a connection whose request head is not complete this long after its first byte",
        low=0,
        above=True,
    )
    # from the request head to the end of its body, however steadily it arrives
    body_timeout_s: float = setting(
        60.0,
        flag="--body-timeout",
        metavar="SECONDS",
        help="answer 408 and close when a request body is not complete this long after its head",
        low=0,
        above=True,
    )
    # open connections from one client address, loopback included
    max_connections_per_client: int = setting(
        64,
        flag="--max-connections-per-client",
        metavar="N",
        help="open connections one client address may hold (loopback included); more are refused at once",
        low=1,
    )
    max_connections: int = setting(  # open connections from all addresses together
        512,
        flag="--max-connections",
        metavar="N",
        help="open connections from all addresses together; more are refused at once (503)",
        low=1,
    )
    # trusted clients: message text may spell control tokens
    allow_special_tokens_in_content: bool = setting(
        False,
        flag="--allow-special-tokens-in-content",
        help="trusted clients only: a chat message's text that spells a special token (<|im_start|>) "
        "becomes that control token (default: it is tokenized as plain text)",
    )

    def __post_init__(self) -> None:
        if not isinstance(self.host, str) or not self.host.strip():
            raise ValueError(f"host must be an address or host name, got {self.host!r}")
        for item in declared(ServerConfig):
            setattr(self, item.name, _checked(item, getattr(self, item.name)))
        if isinstance(self.api_keys, str) or not isinstance(self.api_keys, (list, tuple)):
            raise ValueError(f"api_keys must be a list of keys, got {self.api_keys!r}")
        self.api_keys = named_keys(self.api_keys)
        if not self.loopback and not self.api_keys and not self.allow_no_key:
            raise ValueError(
                f"{self.host} can be reached from other machines: set an API key "
                "(or allow serving without one on a trusted network)"
            )
        if "*" in self.cors_origins and not self.api_keys:
            raise ValueError(
                "allowed origins '*' let every web page the user opens call this server: set an API key, "
                "or name the origins"
            )

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
