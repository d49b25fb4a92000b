"""Raw TCP clients for connection-level attacks: half-open sockets, trickled bytes, other source addresses."""

from __future__ import annotations

import json
import select
import socket
from urllib.parse import urlsplit

BOUND_S = 30.0  # bounds a hang only: every wait below returns as soon as the server acts


def open_socket(url: str, source: str | None = None) -> socket.socket:
    """A connected socket to ``url``'s host and port, from loopback address ``source`` when given."""
    parts = urlsplit(url)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if source is not None:
        sock.bind((source, 0))
    sock.settimeout(BOUND_S)
    sock.connect((parts.hostname, parts.port))
    return sock


def read_to_close(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (a reset counts as a close)."""
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk


def read_response(sock: socket.socket) -> bytes:
    """One whole response on a connection the server keeps open (its body by Content-Length)."""
    data = b""
    while b"\r\n\r\n" not in data or len(data.partition(b"\r\n\r\n")[2]) < content_length(data):
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def content_length(data: bytes) -> int:
    for line in data.partition(b"\r\n\r\n")[0].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


def trickle(sock: socket.socket, pieces: list[bytes], gap_s: float) -> bool:
    """Send ``pieces`` ``gap_s`` apart; True when the server answered or closed before the last one."""
    for piece in pieces:
        try:
            sock.sendall(piece)
        except (BrokenPipeError, ConnectionResetError):
            return True
        readable, _, _ = select.select([sock], [], [], gap_s)
        if readable:
            return True
    return False


def parse_response(data: bytes) -> tuple[int, dict[str, str], object]:
    """Status, headers (lower-case names) and JSON body of one raw HTTP/1.1 response."""
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", len(body)))
    return status, headers, json.loads(body[:length]) if length else None


def get(path: str, host: str) -> bytes:
    """A plain GET request head that keeps the connection open."""
    return f"GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
