"""OpenAI-compatible HTTP endpoint over the engine (no Qt)."""

from multilora_studio.server.app import create_app
from multilora_studio.server.config import ServerConfig
from multilora_studio.server.request_log import RequestLog, RequestRecord
from multilora_studio.server.runner import ApiServer, PortInUseError, bind_socket

__all__ = [
    "ApiServer",
    "PortInUseError",
    "RequestLog",
    "RequestRecord",
    "ServerConfig",
    "bind_socket",
    "create_app",
]
