"""How a failure to render or tokenize a prompt is answered."""

from __future__ import annotations

from multilora_studio.engine.text.template_sandbox import TemplateBusy
from multilora_studio.server.errors import ApiError


def prompt_error(error: Exception, param: str) -> ApiError:
    """A busy template renderer is a 503 to retry; anything else (the chat template refused the
    conversation, or ran past its deadline, memory or output cap) a 400 naming ``param``."""
    if isinstance(error, TemplateBusy):
        return ApiError(503, str(error), "server_busy", headers={"Retry-After": "1"})
    return ApiError(400, f"the prompt could not be prepared: {error}", "invalid_value", param)
