"""``multilora-studio serve --ray``: the same endpoint as a Ray Serve application (engine
replicas on a Ray cluster's GPUs behind one OpenAI ingress; ``deploy/ray_serve.py``)."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from multilora_studio.adapters.lora_modules import parse_lora_modules
from multilora_studio.adapters.registry import Registry
from multilora_studio.cli.shared import check_fraction, engine_configs, wait_for_stop_signal
from multilora_studio.deploy.base_pool import identify_base
from multilora_studio.util import extra_install_hint

if TYPE_CHECKING:
    from multilora_studio.ray_app.deployments import RayServeOptions
    from multilora_studio.server import ServerConfig

log = logging.getLogger(__name__)


def add_ray_arguments(parser: argparse.ArgumentParser) -> None:
    """``--ray`` and the flags of its deployment."""
    parser.add_argument(
        "--ray",
        action="store_true",
        help="serve as a Ray Serve application: engine replicas on the Ray cluster's GPUs behind one "
        "OpenAI ingress; requests for an adapter go to replicas that hold it (needs the [ray] extra)",
    )
    parser.add_argument(
        "--address",
        default=None,
        metavar="ADDR",
        help="with --ray: the Ray cluster to join (auto, or ray://HOST:PORT); default: a Ray started "
        "on this machine for this run",
    )
    scale = parser.add_mutually_exclusive_group()
    scale.add_argument("--replicas", type=int, default=1, help="with --ray: engine replicas (default: 1)")
    scale.add_argument(
        "--autoscale",
        default=None,
        metavar="MIN:MAX",
        help="with --ray: between MIN and MAX engine replicas, scaled on the requests they hold",
    )
    parser.add_argument(
        "--gpus-per-replica",
        type=float,
        default=None,
        metavar="N",
        help="with --ray: GPUs each engine replica reserves (default: 1, or 0 with --device cpu)",
    )


def ray_serve_options(args: argparse.Namespace, server: ServerConfig) -> RayServeOptions:
    """The deployment the flags describe: one base model, its ``--lora-modules`` and (unless
    ``--no-library``) the library's adapters validated against its weights."""
    given = {"--devices": args.devices is not None, "--allow-hub-adapters": args.allow_hub_adapters}
    refused = [flag for flag, present in given.items() if present]
    if refused:
        raise ValueError(f"--ray does not take {', '.join(refused)}: Ray places the replicas")
    configs = engine_configs(args)
    if len(configs) != 1:
        raise ValueError("--ray serves one --model; start one application per base model")
    adapters = {name: str(path) for name, path in parse_lora_modules(args.lora_modules).items()}
    if not args.no_library:
        adapters = (
            library_adapters(identify_base(configs[0])[1], check_fraction(args.min_pass_rate)) | adapters
        )
    autoscaling = parse_autoscale(args.autoscale) if args.autoscale is not None else None
    require_ray_serve()
    from multilora_studio.ray_app.deployments import RayServeOptions  # Ray is an optional extra

    return RayServeOptions(
        engine=configs[0],
        adapters=adapters,
        server=server,
        replicas=args.replicas,
        autoscaling=autoscaling,
        gpus_per_replica=args.gpus_per_replica,
    )


def parse_autoscale(text: str) -> tuple[int, int]:
    """``MIN:MAX`` as (min, max) replicas."""
    low, sep, high = text.partition(":")
    if not sep or not low.strip().isdigit() or not high.strip().isdigit():
        raise ValueError(f"--autoscale takes MIN:MAX replicas, e.g. 1:4; got {text!r}")
    return int(low), int(high)


def library_adapters(digest: str, min_pass_rate: float | None) -> dict[str, str]:
    """name -> folder of each active library adapter validated against the base of ``digest``
    that passes the quality gate (``Registry.served_records``)."""
    try:
        registry = Registry()
    except (OSError, ValueError) as error:
        log.warning("serving without the adapter library: %s", error)
        return {}
    chosen = {}
    for record in registry.served_records(min_pass_rate):
        if record.base_status(digest) == "ok":
            chosen[record.name] = str(Path(record.path))
        else:
            log.info("library adapter %s not served: trained on another base", record.name)
    return chosen


def start_on_ray(options: RayServeOptions, address: str | None) -> str:
    """Deploy ``options`` (joining the cluster at ``address``, or one Ray started here when
    none is running); returns the endpoint's URL."""
    import ray
    from ray import serve

    from multilora_studio.ray_app.deployments import APP_NAME, build_app

    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False)
    serve.start(http_options={"host": options.server.host, "port": options.server.port})
    serve.run(build_app(options), name=APP_NAME, route_prefix="/")
    return f"http://{options.server.host}:{options.server.port}"


def stop_on_ray() -> None:
    """Delete the application and stop Serve (a cluster joined by ``--address`` keeps running)."""
    import ray
    from ray import serve

    from multilora_studio.ray_app.deployments import APP_NAME

    if not ray.is_initialized():
        return
    try:
        serve.delete(APP_NAME)
    finally:
        serve.shutdown()
        ray.shutdown()


def require_ray_serve() -> None:
    """RuntimeError naming the install command when Ray Serve cannot be imported (an optional extra)."""
    try:
        import ray.serve  # noqa: F401
    except ImportError as error:
        raise RuntimeError(f"--ray needs Ray Serve ({error}): {extra_install_hint('ray')}") from None


def run_serve_ray(args: argparse.Namespace, server: ServerConfig) -> int:
    options = ray_serve_options(args, server)
    try:
        url = start_on_ray(options, args.address)
        names = [identify_base(options.engine)[0], *sorted(options.adapters)]
        print(f"serving {', '.join(names)} at {url}/v1 on Ray", flush=True)
        wait_for_stop_signal()
    finally:
        stop_on_ray()
    return 0
