"""Who can reach a bound address, and which Host header names its clients may send."""

from __future__ import annotations

import contextlib
import ipaddress
import socket

import psutil

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
WILDCARD_HOSTS = ("0.0.0.0", "::", "")


def is_loopback(host: str) -> bool:
    """True for names and addresses that only this machine can reach."""
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def interface_addresses() -> list[str]:
    """Every IPv4 and IPv6 address of this machine's network interfaces (no zone suffix)."""
    families = (socket.AF_INET, socket.AF_INET6)
    return [
        entry.address.split("%", 1)[0]
        for entries in psutil.net_if_addrs().values()
        for entry in entries
        if entry.family in families
    ]


def machine_names() -> list[str]:
    names = [socket.gethostname()]
    with contextlib.suppress(OSError):
        names.append(socket.getfqdn())
    return names


def bound_host_names(host: str) -> tuple[str, ...]:
    """The names a client uses to reach ``host`` on this machine, for the Host check.

    A wildcard bind answers on every interface: every interface address and the machine's
    names. A named or numbered bind: that name or address. Loopback names always count:
    a DNS-rebinding page sends its own domain as Host, never one of these.
    """
    names = [*LOOPBACK_NAMES, host.strip("[]")]
    if host in WILDCARD_HOSTS:
        names += interface_addresses() + machine_names()
    return tuple(dict.fromkeys(name.lower() for name in names if name))
