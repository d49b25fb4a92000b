"""Engine fixtures over the tiny model."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from multilora_studio.adapters.peft_adapter import load_peft_adapter
from multilora_studio.engine import Engine, EngineConfig
from multilora_studio.engine.model.model_source import resolve_model
from multilora_studio.engine.residency.adapter_packing import pack_adapter
from multilora_studio.engine.step import step_graphs
from multilora_studio.engine.step.lora_plan_builder import build_lora_plan, shrink_in_gemm_rows
from multilora_studio.engine.step.runner import ModelRunner
from tests.engine.reference import PeftReference


@pytest.fixture(scope="session")
def peft_reference(tiny_model_dir, tiny_adapters) -> PeftReference:
    return PeftReference(tiny_model_dir, tiny_adapters)


def tiny_engine_config(model_dir, **overrides) -> EngineConfig:
    """The tiny model's engine settings of these tests, with ``overrides`` (``device`` among them)."""
    settings = dict(
        model=str(model_dir),
        dtype="float32",
        max_loras=8,
        max_lora_rank=32,
        max_num_seqs=16,
        max_model_len=256,
        max_num_batched_tokens=512,
    )
    settings.update(overrides)
    return EngineConfig(**settings)


@pytest.fixture
def make_engine(tiny_model_dir, tiny_adapters, engine_device):
    """Build an engine on the tiny model with every fixture adapter added; shut down after the test."""
    engines: list[Engine] = []

    def build(adapters: list[str] | None = None, **overrides) -> Engine:
        engine = Engine(tiny_engine_config(tiny_model_dir, **{"device": engine_device, **overrides}))
        engines.append(engine)
        for name in tiny_adapters if adapters is None else adapters:
            engine.add_adapter(name, tiny_adapters[name])
        return engine

    yield build
    for engine in engines:
        engine.shutdown()


@pytest.fixture(scope="session")
def tiny_engine(tiny_model_dir, tiny_adapters, engine_device):
    """One engine for the engine suite, as ``make_engine()`` builds it (default settings, every
    fixture adapter), for tests that only submit requests: they leave its adapters and settings
    as they found them, and nothing running when they end."""
    with Engine(tiny_engine_config(tiny_model_dir, device=engine_device)) as engine:
        for name, path in tiny_adapters.items():
            engine.add_adapter(name, path)
        yield engine


RUNNER_BLOCK = 4  # KV block size of tiny_runner


def tiny_runner(
    model_dir,
    adapters: dict,
    device: str,
    lora_backend: str | None = None,
    plan_changes: dict | None = None,
    **overrides,
) -> tuple[ModelRunner, dict[str | None, int]]:
    """A float32 runner on ``device`` with ``adapters`` (name -> folder) in slots 0, 1, ...,
    laid out as an engine's (its LoRA plan and shrink-in-GEMM rows), 64 KV blocks, no CUDA
    graphs of its own (the tests make the graphs they compare); the slot of each name (None -> -1).
    ``lora_backend``: the LoRA kernels' backend instead of the device's own ("triton" on the
    CPU runs CUDA's kernels in Triton's interpreter); ``plan_changes``: LoRAPlan fields to replace."""
    settings = dict(
        model=str(model_dir), device=device, dtype="float32", max_loras=4, max_lora_rank=32,
        max_num_seqs=16, max_model_len=64, max_num_batched_tokens=256, block_size=RUNNER_BLOCK,
        enforce_eager=True,
    )  # fmt: skip
    config = EngineConfig(**{**settings, **overrides})
    where = torch.device(device)
    plan = build_lora_plan(config, where, torch.float32)
    if lora_backend is not None:
        plan = dataclasses.replace(plan, backend=lora_backend)
    plan = dataclasses.replace(plan, **(plan_changes or {}))
    base = resolve_model(config.model, torch.float32, where, None, shrink_in_gemm_rows(config, plan))
    runner = ModelRunner(config, base.spec, base.weights, 64, where, torch.float32, plan)
    spec = base.spec
    slot_of: dict[str | None, int] = {None: -1}
    for slot, (name, folder) in enumerate(adapters.items()):
        host = load_peft_adapter(
            name,
            folder,
            spec.num_layers,
            spec.projection_shape,
            config.max_lora_rank,
            spec.vocab,
            dtype=torch.float32,
        )
        runner.lora.upload(slot, pack_adapter(host, spec, torch.float32, pin=False))
        slot_of[name] = slot
    return runner, slot_of


def capture_graphs_on(device: str, monkeypatch) -> None:
    """CUDA graphs as ``device`` has them: real on CUDA; on the CPU capture stood in as
    ``capture_graph`` does it (the work runs once at capture, then again at each replay)."""
    if torch.device(device).type == "cuda":
        return

    def capture(work, pool, on):
        work()
        return SimpleNamespace(replay=work)

    monkeypatch.setattr(step_graphs, "capture_graph", capture)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)


@pytest.fixture(scope="module")
def runner_with_adapters(tiny_model_dir, tiny_adapters, engine_device):
    names = ["tiny-r4-qv", "tiny-r8-all", "tiny-r16-mlp", "tiny-r32-ko-down"]
    runner, slot_of = tiny_runner(
        tiny_model_dir, {name: tiny_adapters[name] for name in names}, engine_device
    )
    return runner, {name: slot_of[name] for name in names}
