"""The Ray Serve application: engine replicas (one engine each, on a GPU or CPUs) behind an
ingress that serves this project's OpenAI routes, API keys and per-key limits.

An adapter's requests go out with its name as Ray's multiplexed model id, so Ray's router sends
them to replicas that hold it (``remote_engine.py``). Adapters are folders every node can read (a
shared path; Hub adapters pulled into a shared library). Engine metrics are exported by each
replica through Ray's metrics (Prometheus, tagged by deployment and replica); the ingress's
own ``/metrics`` carries the request series.

``multilora-studio serve --ray`` starts it; ``serve run multilora_studio.ray_app.deployments:build
model=PATH adapters=name=path,... replicas=2`` does too (``build``'s arguments).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI
from ray import serve
from ray.serve.deployment import Application
from ray.serve.handle import DeploymentHandle

from multilora_studio.adapters.lora_modules import parse_lora_modules
from multilora_studio.deploy.base_pool import BasePool
from multilora_studio.engine import EngineConfig, least_host_capacity
from multilora_studio.invalid_setting import InvalidSetting
from multilora_studio.ray_app.remote_engine import EngineFacts, RemoteEngine, engine_replica_class
from multilora_studio.server.app import create_app
from multilora_studio.server.config import ServerConfig
from multilora_studio.server.runner import build_server_state

APP_NAME = "multilora-studio"
ENGINE_DEPLOYMENT = "EngineReplica"
INGRESS_DEPLOYMENT = "OpenAIIngress"


@dataclass
class RayServeOptions:
    """One base model's deployment. ``replicas``: a fixed count, or ``autoscaling`` (min, max)
    replicas scaled on ongoing requests. ``gpus_per_replica`` None: 1 unless the engine's
    device is the CPU."""

    engine: EngineConfig
    adapters: dict[str, str] = field(default_factory=dict)  # name -> folder every node can read
    server: ServerConfig = field(default_factory=ServerConfig)
    replicas: int = 1
    autoscaling: tuple[int, int] | None = None
    gpus_per_replica: float | None = None
    cpus_per_replica: float = 1.0

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise InvalidSetting.of("replicas", self.replicas, "must be >= 1, got {value}")
        if self.autoscaling is not None and not 0 < self.autoscaling[0] <= self.autoscaling[1]:
            raise ValueError(f"autoscaling needs 0 < min <= max replicas, got {self.autoscaling}")


@serve.ingress()
class OpenAIIngress:
    """The OpenAI routes (``server/app.py``) over a ``RemoteEngine`` of the engine deployment."""

    async def __init__(  # type: ignore[misc]  # Ray Serve awaits an async constructor
        self, engines: DeploymentHandle, server: ServerConfig, adapters: dict[str, str]
    ) -> None:
        facts: EngineFacts = await engines.facts.remote()
        self.engine = RemoteEngine(engines, facts)
        for name, path in adapters.items():
            self.engine.register(name, path, await engines.describe_adapter.remote(name, path))
        self.server = server
        self.pool = BasePool([facts.config], started=[self.engine])

    def __serve_build_asgi_app__(self) -> FastAPI:
        """Ray Serve's hook, after the constructor: the app this replica serves."""
        return create_app(self.server, build_server_state(self.pool, self.server))

    def __del__(self) -> None:
        engine = getattr(self, "engine", None)  # absent when the constructor failed
        if engine is not None:
            engine.shutdown()


def build_app(options: RayServeOptions) -> Application:
    """The application to ``serve.run``: the ingress bound to the engine deployment."""
    config = options.engine
    gpus = options.gpus_per_replica
    if gpus is None:
        gpus = 0.0 if config.device == "cpu" else 1.0
    scale: dict[str, Any] = {"num_replicas": options.replicas}
    if options.autoscaling is not None:
        low, high = options.autoscaling
        scale = {
            "autoscaling_config": {
                "min_replicas": low,
                "max_replicas": high,
                "target_ongoing_requests": max(1, config.max_num_seqs // 2),
            }
        }
    engines = serve.deployment(
        name=ENGINE_DEPLOYMENT,
        max_ongoing_requests=config.max_num_seqs,
        ray_actor_options={"num_gpus": gpus, "num_cpus": options.cpus_per_replica},
        **scale,
    )(engine_replica_class(least_host_capacity(config)))
    ingress = serve.deployment(
        name=INGRESS_DEPLOYMENT,
        num_replicas=1,  # the per-key limits are counted in one place
        max_ongoing_requests=options.server.max_in_flight,
        ray_actor_options={"num_cpus": 0},
    )(OpenAIIngress)
    return ingress.bind(engines.bind(config), options.server, options.adapters)


def build(args: Mapping[str, str]) -> Application:
    """``serve run multilora_studio.ray_app.deployments:build key=value ...``: ``model``,
    ``adapters`` (``name=path`` pairs, comma-separated), ``replicas`` or ``min_replicas`` and
    ``max_replicas``, ``api_key``, and any ``EngineConfig`` field by name (``device``,
    ``dtype``, ``max_loras``, ``max_model_len``, ...)."""
    values = dict(args)
    adapters = parse_lora_modules([a for a in values.pop("adapters", "").split(",") if a])
    replicas = int(values.pop("replicas", "1"))
    low, high = values.pop("min_replicas", None), values.pop("max_replicas", None)
    api_key = values.pop("api_key", None)
    fields = {f.name: f for f in dataclasses.fields(EngineConfig)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ValueError(
            f"unknown arguments {', '.join(unknown)}; EngineConfig fields, adapters, replicas, api_key"
        )
    engine = EngineConfig(**{name: _parsed(fields[name].type, text) for name, text in values.items()})
    return build_app(
        RayServeOptions(
            engine=engine,
            adapters={name: str(path) for name, path in adapters.items()},
            server=ServerConfig(host="0.0.0.0", api_keys=(api_key,) if api_key else (), allow_no_key=True),
            replicas=replicas,
            autoscaling=(int(low), int(high)) if low is not None and high is not None else None,
        )
    )


def _parsed(annotation: Any, text: str) -> Any:
    """A ``key=value`` argument as its ``EngineConfig`` field's type (annotations are strings)."""
    kind = str(annotation)
    if text == "None" and "None" in kind:
        return None
    if kind.startswith("bool"):
        return text.lower() in ("1", "true", "yes")
    if kind.startswith("int"):
        return int(text)
    if kind.startswith("float"):
        return float(text)
    return text
