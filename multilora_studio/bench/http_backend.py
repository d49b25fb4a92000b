"""The ``--endpoint`` backend: streaming ``/v1/completions`` on any OpenAI-compatible server.

The request's ``model`` field names the adapter (vLLM's convention); the prompt is sent
as token ids with ``ignore_eos`` so every request produces exactly ``max_tokens``.
TTFT is the arrival of the first chunk that carries text or a finish reason; TPOT
spreads the time from there to the last chunk over the remaining tokens (the usage
record's ``completion_tokens`` when the server sends one, else the chunk count).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Any

import httpx

from multilora_studio.bench.stats import RequestResult

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServedModels:
    """What ``/v1/models`` lists: the base model and the adapters (entries with a ``parent``)."""

    base: str
    adapters: tuple[str, ...]


def _headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def served_models(url: str, api_key: str | None = None, timeout: float = 30.0) -> ServedModels:
    """Read ``/v1/models``; ValueError with the server's message when it cannot be read."""
    try:
        response = httpx.get(f"{url}/v1/models", headers=_headers(api_key), timeout=timeout)
    except httpx.HTTPError as error:
        raise ValueError(f"cannot reach {url}/v1/models: {error}") from None
    if response.status_code != 200:
        raise ValueError(f"{url}/v1/models answered {response.status_code}: {response.text[:300]}")
    entries = response.json().get("data") or []
    bases = [e["id"] for e in entries if not e.get("parent")]
    adapters = tuple(e["id"] for e in entries if e.get("parent"))
    if not bases:
        raise ValueError(f"{url}/v1/models lists no base model")
    return ServedModels(bases[0], adapters)


class EndpointBackend:
    """One streaming completion per request, over a shared async HTTP client."""

    def __init__(self, url: str, base_model: str, api_key: str | None = None, timeout: float = 600.0) -> None:
        self.url = url.rstrip("/")
        self.base_model = base_model
        self.client = httpx.AsyncClient(
            headers=_headers(api_key),
            timeout=httpx.Timeout(timeout, connect=30.0),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
        )

    async def aclose(self) -> None:
        await self.client.aclose()

    async def send(self, prompt: list[int], adapter: str | None, output_len: int) -> RequestResult:
        result = RequestResult(adapter, len(prompt), output_len)
        body = {
            "model": adapter or self.base_model,
            "prompt": prompt,
            "max_tokens": output_len,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        result.start = time.monotonic()
        chunks, usage_tokens = 0, None
        try:
            async with self.client.stream("POST", f"{self.url}/v1/completions", json=body) as response:
                if response.status_code != 200:
                    text = (await response.aread()).decode(errors="replace")
                    result.error = f"HTTP {response.status_code}: {text[:300]}"
                    return result
                async for line in response.aiter_lines():
                    payload = _event(line)
                    if payload is None:
                        continue
                    if payload == "[DONE]":
                        break
                    now = time.monotonic()
                    if "error" in payload:
                        result.error = str(payload["error"].get("message", payload["error"]))
                        return result
                    for choice in payload.get("choices") or []:
                        if choice.get("text") or choice.get("finish_reason"):
                            chunks += 1
                            result.first_token = result.first_token or now
                            result.end = now
                    if payload.get("usage"):
                        usage_tokens = payload["usage"].get("completion_tokens")
        except httpx.HTTPError as error:
            result.error = f"{type(error).__name__}: {error}"
            return result
        result.output_tokens = usage_tokens if usage_tokens is not None else chunks
        if result.end is None:
            result.error = "the stream ended without a completion"
        return result


def _event(line: str) -> Any:
    """The JSON payload of an SSE ``data:`` line, ``"[DONE]"``, or None for other lines."""
    if not line.startswith("data:"):
        return None
    data = line[len("data:") :].strip()
    if data == "[DONE]":
        return data
    try:
        return json.loads(data)
    except json.JSONDecodeError:
        log.warning("ignoring a malformed event: %s", data[:200])
        return None
