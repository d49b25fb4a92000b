"""The start-up warm-up: which steps it runs, and that it leaves the runner as it found it."""

from __future__ import annotations

import pytest
import torch
from torch.overrides import TorchFunctionMode

from multilora_studio.engine import SamplingParams
from multilora_studio.engine.batch.block_manager import BlockManager
from multilora_studio.engine.batch.scheduler import ScheduledChunk, StepPlan
from multilora_studio.engine.batch.sequence import Sequence
from multilora_studio.engine.model.lora_weights import LORA_GROUPS, row_buffer_bytes
from multilora_studio.engine.step.kernel_warmup import (
    prefill_lengths,
    warm_up_kernels,
    warm_up_sampling,
    warmup_steps,
    warmup_token_counts,
)
from multilora_studio.kernels import fused_ops_cpu, lora_cpu, paged_attention_cpu
from multilora_studio.kernels.triton_support import interpreting
from tests.engine.conftest import RUNNER_BLOCK, tiny_runner
from tests.fixtures import ATTENTION_TARGETS, MLP_TARGETS, TINY_ADAPTERS, AdapterSpec, build_adapter
from tests.kernel_variants import VariantLog, describe


class TorchCalls(TorchFunctionMode):
    """Records the torch functions called inside it, with the last dimension of their first tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.widths: dict[str, set[int]] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        first = next((a for a in args if isinstance(a, torch.Tensor)), None)
        width = first.shape[-1] if first is not None and first.dim() else 0
        self.widths.setdefault(getattr(func, "__name__", str(func)), set()).add(width)
        return func(*args, **(kwargs or {}))


# What a sampled step runs that a greedy one does not: the kernels the sampling warm-up loads.
SAMPLING_CALLS = ("sort", "topk", "multinomial")


def test_token_counts_cross_every_power_of_two_and_its_odd_neighbour():
    assert warmup_token_counts(1) == []  # a one-token chunk is a decode-shaped step
    assert warmup_token_counts(20) == [2, 3, 4, 5, 8, 9, 16, 17, 20]
    counts = warmup_token_counts(8192)
    assert counts[-1] == 8192 and 4097 in counts and 8193 not in counts
    assert prefill_lengths(300, 128) == [128, 128, 44]
    assert prefill_lengths(256, 128) == [128, 128]


def test_warm_up_runs_every_step_kind_and_leaves_slots_and_outputs_unchanged(runner_with_adapters):
    runner, slots = runner_with_adapters
    steps = warmup_steps(runner.config, decode_graphs=False)
    # prompt chunks up to max_num_batched_tokens (256) in pieces of max_model_len (64),
    # then decode batches up to max_num_seqs (16): no CUDA graphs on the CPU
    assert steps[0] == [2] and [64, 64, 64, 64] in steps and [64, 1] in steps
    assert [1] * 16 in steps and [1] in steps
    assert all(max(lengths) <= runner.config.max_model_len for lengths in steps)

    def prefill_logits() -> torch.Tensor:
        blocks = BlockManager(runner.kv_cache.shape[2], RUNNER_BLOCK)
        seqs = []
        for i, adapter in enumerate([None, *slots]):
            seq = Sequence(f"w{i}", [7 + i, 11, 13 + i, 17], adapter, SamplingParams(), 0)
            blocks.grow(seq, seq.num_tokens)
            seqs.append(seq)
        plan = StepPlan([ScheduledChunk(s, 0, s.num_tokens) for s in seqs])
        logits, _ = runner.run(runner.prepare(plan, blocks, {None: -1, **slots}))
        return logits.clone()

    before = prefill_logits()
    ranks = runner.lora.slot_ranks.clone()
    a_sums = {group: t.sum().item() for group, t in runner.lora.a.items()}
    config = runner.config
    with TorchCalls() as calls:
        passes, seconds = warm_up_kernels(
            runner.model, runner.kv_caches, runner.lora, config.max_num_batched_tokens, steps
        )
    vocab = runner.spec.vocab_size
    assert [name for name in SAMPLING_CALLS if vocab not in calls.widths.get(name, ())] == []
    fitting = [s for s in steps if sum(-(-n // RUNNER_BLOCK) for n in s) <= runner.kv_cache.shape[2]]
    assert passes == 3 * len(fitting) and seconds > 0  # without LoRA, with it, with its row terms
    assert runner.lora.row_scale == runner.lora.row_bias == {}  # made for the warm-up only
    assert torch.equal(runner.lora.slot_ranks, ranks)
    assert {group: t.sum().item() for group, t in runner.lora.a.items()} == a_sums
    torch.testing.assert_close(prefill_logits(), before, rtol=0, atol=0)


def test_the_kv_budget_sets_aside_what_the_row_buffers_take(runner_with_adapters):
    """The warm-up makes every group's per-row buffers for its row-term pass (and the first
    DoRA or bias adapter keeps them): the KV cache's budget leaves their bytes out."""
    runner, _ = runner_with_adapters
    lora = runner.lora
    lora.ensure_row_buffers()
    try:
        buffers = [*lora.row_scale.values(), *lora.row_bias.values()]
        held = sum(t.numel() * t.element_size() for t in buffers)
        assert len(buffers) == 2 * len(LORA_GROUPS)
        assert held == row_buffer_bytes(runner.spec, lora.num_slots, runner.dtype)
    finally:
        lora.drop_row_buffers()


def test_no_kernel_compiles_while_serving_after_start_up(make_engine, engine_device):
    if engine_device != "cuda":
        pytest.skip("Triton compiles on CUDA")
    engine = make_engine()
    names = ["tiny-r4-qv", "tiny-r8-all", "tiny-r16-mlp", None]
    prompts = ["Hi", "Hello there, how are you today?", "A" * 70, "Once upon a time " * 9]
    plain = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    scored = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True, logprobs=1, prompt_logprobs=5)
    for round_size in (1, 3, 4, 7, 16):
        for params in (plain, scored):
            engine.generate((prompts * 4)[:round_size], (names * 4)[:round_size], params)
    metrics = engine.metrics(fresh=True)
    assert metrics.kernel_compiles == 0, (
        f"{metrics.kernel_compiles} compiles ({metrics.kernel_compile_s:.1f} s)"
    )


def test_sampling_warm_up_runs_the_sampling_kernels_and_leaves_the_logits_alone():
    logits = torch.randn(3, 50)
    before = logits.clone()
    with TorchCalls() as calls:
        warm_up_sampling(logits, torch.bfloat16)
    assert torch.equal(logits, before)
    # it runs temperature, top-k, top-p and the draw on rows as wide as the logits
    assert [name for name in SAMPLING_CALLS if 50 not in calls.widths.get(name, ())] == []


@pytest.mark.skipif(not lora_cpu.AVAILABLE, reason="needs Numba")
def test_cpu_kernels_compile_at_start_up_not_while_serving(make_engine):
    """Every Numba kernel variant the CPU engine calls is compiled when it starts."""
    kernels = {
        "lora": lora_cpu._kernel,
        "attention": paged_attention_cpu._kernel,
        "norm": fused_ops_cpu._norm,
        "rope": fused_ops_cpu._rope,
    }
    engine = make_engine(device="cpu")
    compiled = {name: len(kernel.signatures) for name, kernel in kernels.items()}
    assert all(compiled.values()), compiled
    names = ["tiny-r4-qv", "tiny-r8-all", None]
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    for size in (1, 3):
        engine.generate([[5, 6, 7, 8][: size + 1]] * size, names[:size], params)
    assert {name: len(kernel.signatures) for name, kernel in kernels.items()} == compiled


ROW_KINDS = (
    AdapterSpec("warm-dora", 8, 16, tuple(ATTENTION_TARGETS + MLP_TARGETS), 41, (("use_dora", True),)),
    AdapterSpec("warm-bias", 4, 8, ("q_proj", "k_proj", "v_proj", "down_proj"), 42, (("lora_bias", True),)),
)


@pytest.fixture(scope="module")
def one_layer_row_adapters(tiny_family_models, tmp_path_factory):
    """The one-layer model (every layer launches the same variants) and a plain adapter
    (tiny-r4-qv's), a DoRA one and a lora_bias one on it, in that order."""
    base = tiny_family_models["llama-one-layer"]
    folder = tmp_path_factory.mktemp("one-layer-row-adapters")
    adapters = {"plain": build_adapter(base, TINY_ADAPTERS[0], folder / "plain")}
    adapters |= {spec.name: build_adapter(base, spec, folder / spec.name) for spec in ROW_KINDS}
    return base, adapters


@pytest.mark.skipif(not interpreting(), reason="the CUDA kernels on the CPU: TRITON_INTERPRET=1")
@pytest.mark.parametrize("shrink_in_gemm", [False, True], ids=["kernel-shrink", "shrink-in-gemm"])
def test_serving_launches_no_triton_variant_that_the_warm_up_did_not(shrink_in_gemm, one_layer_row_adapters):
    """The Triton variants (Triton's own specialisation keys) of a served mix: plain, DoRA and
    lora_bias adapters alone and together, one adapter in the first slot (the narrowest span of
    slots), base rows, prompts, decodes and both in one step, are all launched by the start-up
    warm-up, so on a GPU none compiles while requests wait."""
    base, adapters = one_layer_row_adapters
    runner, slot_of = tiny_runner(
        base, adapters, "cpu", lora_backend="triton", fused_qkv_epilogue=True,
        lora_shrink_in_gemm=shrink_in_gemm, max_num_batched_tokens=8, max_num_seqs=4,
    )  # fmt: skip
    config = runner.config
    with VariantLog() as warm:
        warm_up_kernels(
            runner.model, runner.kv_caches, runner.lora, config.max_num_batched_tokens,
            warmup_steps(config, decode_graphs=False),
        )  # fmt: skip
    blocks = BlockManager(runner.kv_cache.shape[2], RUNNER_BLOCK)
    mixes = [["plain"], ["warm-dora"], ["warm-bias"], ["plain", "warm-dora", "warm-bias", None], [None]]
    with VariantLog() as served:
        for number, names in enumerate(mixes):
            seqs = [
                Sequence(f"s{number}-{i}", [7 + i, 11 + i], name, SamplingParams(), 0)
                for i, name in enumerate(names)
            ]
            for seq in seqs:
                blocks.grow(seq, seq.num_tokens)
            prefill = StepPlan([ScheduledChunk(s, 0, s.num_tokens) for s in seqs])
            runner.run(runner.prepare(prefill, blocks, slot_of))
            for seq in seqs:
                seq.output_token_ids.append(5)
                blocks.grow(seq, seq.num_tokens)
            decode = StepPlan([ScheduledChunk(s, s.num_tokens - 1, 1) for s in seqs])
            runner.run(runner.prepare(decode, blocks, slot_of))
            for seq in seqs:
                blocks.free(seq)
    missing = served.variants - warm.variants
    assert served.variants and not missing, f"{len(missing)} variants not warmed:\n{describe(missing)}"
