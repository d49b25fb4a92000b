"""A quantized base (FP8, AWQ, GPTQ, FP8 quantized at load) under float adapters.

Each format's checkpoint of a tiny random Llama (tests/quant_fixtures.py) is served by the
engine on the CPU (float32, the weights dequantized at load) and compared with:

* a float64 forward pass of its dequantized twin (HF transformers): every prompt token's
  log-probability within ``LOGPROB_TOLERANCE``, the same for every format (the CPU path
  dequantizes exactly: a 4-bit value times a float16 scale, or an e4m3 value times a float32
  scale, is one float32 rounding at most; what is left is float32 arithmetic over 3 layers);
* PEFT on the dequantized twin: a batch of two adapters and base rows, greedy, token for token.

On a GPU host (``MULTILORA_TEST_DEVICE=cuda``) the same tests run the weights quantized on
the device (float32 activations: each weight dequantized, then cuBLAS).

The GPU's paths with the weights kept quantized run through the whole model against the model
dequantized at load: ``cublas`` (the 4-bit weight dequantized by a Triton kernel, run by the
interpreter here) in float32 within ``KEPT_LOGIT_TOLERANCE``; on a GPU host with gemlite,
``gemlite`` (its 4-bit and FP8 GEMVs at these decode-sized row counts) in bfloat16 against the
bfloat16 model, within ``BF16_LOGIT_TOLERANCE`` of the largest logit.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from multilora_studio.engine import Engine, EngineConfig, SamplingParams
from multilora_studio.engine.batch.block_manager import BlockManager
from multilora_studio.engine.batch.scheduler import ScheduledChunk, StepPlan
from multilora_studio.engine.batch.sequence import Sequence
from multilora_studio.engine.model.model_source import resolve_model
from multilora_studio.engine.model.quant_pack import quantize_fp8, quantize_gptq
from multilora_studio.engine.step.lora_plan_builder import build_lora_plan
from multilora_studio.engine.step.quant_plan_builder import base_quantization
from multilora_studio.engine.step.runner import ModelRunner
from multilora_studio.kernels.gemlite_support import gemlite_available
from multilora_studio.kernels.quant_linear import QuantPlan
from multilora_studio.kernels.quant_weight import QuantizedWeight, dequantize
from tests.engine.reference import PeftReference
from tests.fixtures import AdapterSpec, build_adapter
from tests.quant_fixtures import FORMATS, build_quant_base, build_quantized

LOGPROB_TOLERANCE = 2e-4  # float32 engine vs float64 reference, every format (module docstring)
KEPT_LOGIT_TOLERANCE = 2e-4  # float32: weights kept quantized vs dequantized at load
BF16_LOGIT_TOLERANCE = 2e-2  # bfloat16: one rounding of each activation and sum apart
NEW_TOKENS = 16
ADAPTERS = (
    AdapterSpec(
        "q-r8-all", 8, 16, ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"), 21
    ),
    AdapterSpec("q-r16-mlp", 16, 32, ("gate_proj", "up_proj", "down_proj"), 22),
)
PROMPTS = ("Once upon a time", "The quick brown fox jumps over", "def fibonacci(n):")


@pytest.fixture(scope="module")
def quant_base(tmp_path_factory, tokenizer_dir):
    return build_quant_base(tokenizer_dir, tmp_path_factory.mktemp("quant-base"))


@pytest.fixture(scope="module")
def quant_adapters(tmp_path_factory, quant_base):
    root = tmp_path_factory.mktemp("quant-adapters")
    return {spec.name: build_adapter(quant_base, spec, root / spec.name) for spec in ADAPTERS}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, quant_base):
    """kind -> (quantized folder, dequantized twin), built on first use."""
    built: dict[str, tuple] = {}

    def get(kind: str):
        if kind not in built:
            built[kind] = build_quantized(quant_base, kind, tmp_path_factory.mktemp(kind))
        return built[kind]

    return get


def engine_config(model, device: str = "cpu", **overrides) -> EngineConfig:
    settings = dict(
        model=str(model), device=device, dtype="float32", max_loras=4, max_lora_rank=16,
        max_num_seqs=8, max_model_len=128, max_num_batched_tokens=256,
    )  # fmt: skip
    return EngineConfig(**{**settings, **overrides})


def reference_logprobs(folder, prompts: list[list[int]]) -> list[torch.Tensor]:
    """Each prompt token's float64 log-probability (the first token's is None: not scored)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        str(folder), dtype=torch.float64, attn_implementation="eager"
    )
    out = []
    with torch.no_grad():
        for ids in prompts:
            logits = model(input_ids=torch.tensor([ids])).logits[0]  # [L, V]
            logprobs = torch.log_softmax(logits, dim=-1)
            out.append(logprobs[torch.arange(len(ids) - 1), torch.tensor(ids[1:])])
    return out


def engine_logprobs(engine: Engine, prompts: list[list[int]]) -> list[torch.Tensor]:
    outputs = engine.score(prompts, [None] * len(prompts))
    return [
        torch.tensor([entry.logprob for entry in output.prompt_logprobs[1:]], dtype=torch.float64)
        for output in outputs
    ]


@pytest.mark.parametrize("kind", FORMATS)
def test_logprobs_equal_a_float64_dequantize_then_matmul_reference(checkpoints, kind, engine_device):
    quantized, dequantized = checkpoints(kind)
    with Engine(engine_config(quantized, engine_device)) as engine:
        assert engine.runner.weights.quantization is not None
        assert engine.runner.weights.quantization.method == kind.split("-")[0]
        prompts = [engine.encode(text) for text in PROMPTS]
        got = engine_logprobs(engine, prompts)
    expected = reference_logprobs(dequantized, prompts)
    for g, e in zip(got, expected, strict=True):
        assert torch.allclose(g, e, atol=LOGPROB_TOLERANCE, rtol=0), (g - e).abs().max()


@pytest.mark.parametrize("kind", ["fp8-channel", "awq", "gptq-act-order"])
def test_mixed_adapter_batch_equals_peft_on_the_dequantized_base(
    checkpoints, quant_adapters, kind, engine_device
):
    quantized, dequantized = checkpoints(kind)
    reference = PeftReference(dequantized, quant_adapters)
    names: list[str | None] = [*quant_adapters, None, "q-r8-all", None]
    with Engine(engine_config(quantized, engine_device)) as engine:
        assert not engine.runner.model.plan.shrink_in_gemm
        for name, path in quant_adapters.items():
            engine.add_adapter(name, path)
        prompts = [engine.encode(PROMPTS[i % len(PROMPTS)]) for i in range(len(names))]
        greedy = SamplingParams(max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True)
        outputs = engine.generate(prompts, names, greedy)
    for prompt, name, output in zip(prompts, names, outputs, strict=True):
        assert output.token_ids == reference.greedy(name, prompt, NEW_TOKENS), name
    base = reference.greedy(None, prompts[0], NEW_TOKENS)
    assert reference.greedy(names[0], prompts[0], NEW_TOKENS) != base, "the adapter must matter"


AT_LOAD = {"fp8": quantize_fp8, "int4": lambda w: quantize_gptq(w, zero_offset=0)}


@pytest.mark.parametrize("method", sorted(AT_LOAD))
def test_quantizing_at_load_serves_the_quantized_float_base(quant_base, tmp_path, engine_device, method):
    """fp8 (per channel) and int4 (4-bit, groups of 128, round to nearest) of a float checkpoint
    equal the float64 forward pass of its projections quantized and dequantized."""
    from safetensors.torch import load_file, save_file

    with Engine(engine_config(quant_base, engine_device, quantization=method)) as engine:
        quantization = engine.runner.weights.quantization
        assert quantization is not None and quantization.at_load and quantization.method == method
        prompts = [engine.encode(text) for text in PROMPTS]
        got = engine_logprobs(engine, prompts)
    # the reference: every projection quantized and back, in float64
    twin = tmp_path / "twin"
    import shutil

    shutil.copytree(quant_base, twin)
    tensors = load_file(str(quant_base / "model.safetensors"))
    for name, tensor in tensors.items():
        if name.endswith("_proj.weight"):
            tensors[name] = dequantize(AT_LOAD[method](tensor), torch.float64).float()
    save_file(tensors, str(twin / "model.safetensors"), metadata={"format": "pt"})
    expected = reference_logprobs(twin, prompts)
    for g, e in zip(got, expected, strict=True):
        assert torch.allclose(g, e, atol=LOGPROB_TOLERANCE, rtol=0), (g - e).abs().max()
    float_logprobs = reference_logprobs(quant_base, prompts)
    assert any(not torch.allclose(f, e, atol=1e-5) for f, e in zip(float_logprobs, expected, strict=True))


def prefill_logits(runner: ModelRunner, slots: dict[str | None, int]) -> torch.Tensor:
    """Logits [3, V] of the last token of three prompts (base and two adapter slots) in one step."""
    blocks = BlockManager(runner.kv_cache.shape[2], runner.block_size)
    seqs = []
    for i, adapter in enumerate(slots):
        seq = Sequence(f"q{i}", [7 + i, 11, 13 + i, 17, 19, 23 + i], adapter, SamplingParams(), 0)
        blocks.grow(seq, seq.num_tokens)
        seqs.append(seq)
    plan = StepPlan([ScheduledChunk(s, 0, s.num_tokens) for s in seqs])
    logits, _ = runner.run(runner.prepare(plan, blocks, slots))
    return logits.clone()


def quant_runner(
    folder, plan: QuantPlan, adapters: dict, device_name: str, dtype: torch.dtype = torch.float32
) -> tuple[ModelRunner, dict[str | None, int]]:
    from multilora_studio.adapters.peft_adapter import load_peft_adapter
    from multilora_studio.engine.residency.adapter_packing import pack_adapter

    config = engine_config(folder, device_name, cpu_weight_packing=False)
    device = torch.device(device_name)
    quantization = base_quantization(config)
    base = resolve_model(config.model, dtype, device, None, 0, quantization, plan)
    lora_plan = build_lora_plan(config, device, dtype, quantized=True)
    runner = ModelRunner(config, base.spec, base.weights, 64, device, dtype, lora_plan, plan)
    slots: dict[str | None, int] = {None: -1}
    for slot, (name, path) in enumerate(adapters.items()):
        spec = base.spec
        host = load_peft_adapter(
            name, path, spec.num_layers, spec.projection_shape, 16, spec.vocab, dtype=torch.float32
        )
        runner.lora.upload(slot, pack_adapter(host, spec, dtype, pin=False))
        slots[name] = slot
    return runner, slots


GPU_PATHS = ["cublas"] + (["gemlite"] if torch.cuda.is_available() and gemlite_available() else [])


@pytest.mark.parametrize("path", GPU_PATHS)
@pytest.mark.parametrize("kind", ["fp8-channel", "awq", "gptq-act-order"])
@torch.inference_mode()
def test_the_quantized_gemm_paths_equal_the_dequantized_model(
    checkpoints, quant_adapters, kind, path, engine_device
):
    """The weights kept quantized and multiplied by the GPU's kernels (gemlite where installed,
    cuBLAS over the weight dequantized) give the logits of the model dequantized at load."""
    if path == "gemlite" and engine_device != "cuda":
        pytest.skip("gemlite runs on CUDA only")
    quantized, _ = checkpoints(kind)
    dtype = torch.bfloat16 if path == "gemlite" else torch.float32
    kept = QuantPlan(dequantize_at_load=False, fp8=path, int4=path)
    runner, slots = quant_runner(quantized, kept, quant_adapters, engine_device, dtype)
    qkv = runner.weights.layers[0].qkv
    assert isinstance(qkv, QuantizedWeight) and qkv.gemm is not None
    assert qkv.kind == ("fp8" if kind.startswith("fp8") else "gptq")  # AWQ repacked along K
    dense, dense_slots = quant_runner(
        quantized, dataclasses.replace(kept, dequantize_at_load=True), quant_adapters, engine_device, dtype
    )
    assert isinstance(dense.weights.layers[0].qkv, torch.Tensor)
    got, expected = prefill_logits(runner, slots).float(), prefill_logits(dense, dense_slots).float()
    tolerance = BF16_LOGIT_TOLERANCE * expected.abs().max() if path == "gemlite" else KEPT_LOGIT_TOLERANCE
    assert torch.allclose(got, expected, atol=float(tolerance), rtol=0), (got - expected).abs().max()
