"""How several base models and engine replicas run: ``serve``'s flags and the window's Settings for
a ``BasePool`` of bases (loaded at once, unloaded when idle, waited for) and a ``ReplicaSet`` of
replicas (on which devices, and how far affinity may unbalance them)."""

from __future__ import annotations

from dataclasses import dataclass

from multilora_studio.deploy.dispatch_rule import DEFAULT_MARGIN
from multilora_studio.engine.settings import check_declared, setting


@dataclass(frozen=True)
class PoolSettings:
    """The bases' and replicas' settings (``engine/settings.py`` declarations)."""

    max_resident_bases: int | None = setting(
        None,
        doc="with several bases: at most this many loaded at once; a request for another unloads the "
        "least recently used idle one first; `None`: all",
        flag="--max-resident-bases",
        metavar="N",
        help="with several --model: at most N base models loaded at once; a request for another "
        "unloads the least recently used idle one first (default: all)",
        label="Bases loaded at once",
        tip="At most this many base models loaded at once; a request for another unloads the least "
        "recently used idle one first (serve --max-resident-bases)",
        group="bases",
        low=1,
        none="all",
    )
    keep_alive: float | None = setting(
        None,
        doc="unload a base idle this long (its next request loads it again); `None`: never",
        flag="--keep-alive",
        metavar="SECONDS",
        help="unload a base model idle this long (loaded again by its next request; default: never)",
        label="Unload a base idle for",
        tip="Unload a base model idle this long; its next request loads it (serve --keep-alive)",
        group="bases",
        low=0,
        above=True,
        none="never",
        unit=" seconds",
    )
    base_load_timeout: float = setting(
        600.0,
        doc="how long a request waits for its base to load (or for room), then 503",
        flag="--base-load-timeout",
        metavar="SECONDS",
        help="how long a request waits for its base model to load before a 503",
        low=0,
        above=True,
        unit=" seconds",
    )
    devices: str | None = setting(
        None,
        doc="one engine replica of each base per entry behind one endpoint: `auto` (every visible GPU) "
        "or `cpu` / `cuda:N`, comma-separated; `None`: one engine on `device`",
        flag="--devices",
        metavar="LIST",
        help="one engine replica of each base per entry, behind this one endpoint: auto (every "
        "visible GPU) or cpu / cuda:N, comma-separated (a device named twice holds two replicas, "
        "each with its part of its memory); default: one engine on --device",
        label="Engine replicas on",
        tip="One engine replica per device listed (auto: every visible GPU), behind the same endpoint; "
        "a request goes to a replica that holds its adapter",
        group="engine",
        none="one engine on Device; or auto, or cuda:0,cuda:1",
    )
    dispatch_margin: int = setting(
        DEFAULT_MARGIN,
        doc="with replicas: a request goes to a replica holding its adapter unless that replica has "
        "more than this many requests over the least-loaded one (0: least-loaded only)",
        flag="--dispatch-margin",
        metavar="REQUESTS",
        help="with --devices: a request goes to a replica holding its adapter unless that replica "
        "has more than this many requests over the least-loaded one (0: least-loaded only)",
        label="Dispatch margin",
        tip="With several replicas: a request goes to a replica holding its adapter unless that one "
        "has more than this many requests over the least-loaded replica (0: least-loaded only)",
        group="engine",
        low=0,
        unit=" requests",
    )

    def __post_init__(self) -> None:
        check_declared(self)
