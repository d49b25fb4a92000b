"""Steps above the token-major kernels (prefill) with the shrink in the GEMM over a narrow slot
span: the logits of the shrink kernel's path, the shrink kernel never launched, and the
start-up warm-up launching every Triton variant those steps launch."""

from __future__ import annotations

import collections.abc

import pytest
import torch

from multilora_studio.engine import SamplingParams
from multilora_studio.engine.batch.block_manager import BlockManager
from multilora_studio.engine.batch.scheduler import ScheduledChunk, StepPlan
from multilora_studio.engine.batch.sequence import Sequence
from multilora_studio.engine.step.kernel_warmup import narrow_slot_spans, warm_up_kernels, warmup_steps
from multilora_studio.kernels import LoRAPlan, lora_sgmv
from multilora_studio.kernels.triton_support import interpreting
from tests.engine.conftest import RUNNER_BLOCK, tiny_runner
from tests.engine.test_kernel_warmup import ROW_KINDS
from tests.fixtures import TINY_ADAPTERS, build_adapter
from tests.kernel_variants import VariantLog, describe

pytestmark = pytest.mark.skipif(not interpreting(), reason="the CUDA kernels on the CPU: TRITON_INTERPRET=1")

# max_lora_rank 32 (tiny_runner): slots 0-3 (a span of 4) append 128 A rows a slice; steps of
# 3 tokens and more are above the token-major kernels (short prompts: the interpreter runs them)
NARROW = {"bgmv_max_tokens": 2, "grouped_shrink_in_gemm_rows": 128}


@pytest.fixture(scope="module")
def row_adapters(tiny_model_dir, tiny_adapters, tmp_path_factory):
    """A plain adapter, a DoRA one and a lora_bias one, in slots 0, 1 and 2."""
    folder = tmp_path_factory.mktemp("row-adapters")
    adapters = {"plain": tiny_adapters["tiny-r8-all"]}
    return adapters | {
        spec.name: build_adapter(tiny_model_dir, spec, folder / spec.name) for spec in ROW_KINDS
    }


def prefill_logits(runner, slot_of, names: collections.abc.Sequence[str | None]) -> torch.Tensor:
    """Logits of one prefill step of 3..(2 + n)-token prompts on ``names`` (each above the plan's
    token-major limit on its own)."""
    blocks = BlockManager(runner.kv_cache.shape[2], RUNNER_BLOCK)
    seqs = []
    for i, name in enumerate(names):
        prompt = [(7 * i + 3 * j) % 90 + 5 for j in range(NARROW["bgmv_max_tokens"] + 1 + i)]
        seq = Sequence(f"p{i}", prompt, name, SamplingParams(), 0)
        blocks.grow(seq, seq.num_tokens)
        seqs.append(seq)
    plan = StepPlan([ScheduledChunk(s, 0, s.num_tokens) for s in seqs])
    logits, _ = runner.run(runner.prepare(plan, blocks, slot_of))
    return logits.clone()


def test_narrow_spans_cover_each_alignment_of_the_appended_rows():
    plan = LoRAPlan(
        backend="triton", shrink_in_gemm=True, bgmv_max_tokens=256, grouped_shrink_in_gemm_rows=64
    )
    assert narrow_slot_spans(plan, 32, 16) == [1]  # 16 rows a slot: every span aligns alike
    assert narrow_slot_spans(plan, 32, 8) == [1, 2]
    assert narrow_slot_spans(plan, 32, 4) == [1, 2, 4]
    assert narrow_slot_spans(plan, 32, 128) == []  # one slot's rows are over the limit
    assert narrow_slot_spans(LoRAPlan(backend="triton", shrink_in_gemm=False), 32, 16) == []
    assert plan.shrinks_in_gemm(256) and not plan.shrinks_in_gemm(257)  # no span given
    assert plan.shrinks_in_gemm(4096, 64) and not plan.shrinks_in_gemm(4096, 80)
    assert not plan.shrinks_in_gemm(4096, 0)
    with pytest.raises(ValueError, match="grouped_shrink_in_gemm_rows"):
        LoRAPlan(grouped_shrink_in_gemm_rows=-1)


@pytest.mark.parametrize(
    "names",
    [["plain", None], ["plain", "warm-dora", None, "warm-bias"], [None, "warm-bias"]],
    ids=["slot0-base", "three-slots-rows-base", "bias-base"],
)
def test_large_steps_over_a_narrow_span_equal_the_shrink_kernels_path(
    row_adapters, tiny_model_dir, names, monkeypatch
):
    """The same logits (float32) with the shrink in the GEMM as with the slot-grouped shrink
    kernel, DoRA's and lora_bias's row terms included, and no shrink kernel launched."""
    launches: list[int] = []
    shrink = lora_sgmv.shrink_partials

    def counted(*args, **kwargs):
        launches.append(1)
        return shrink(*args, **kwargs)

    monkeypatch.setattr(lora_sgmv, "shrink_partials", counted)
    logits = {}
    for rows in (0, NARROW["grouped_shrink_in_gemm_rows"]):
        runner, slot_of = tiny_runner(
            tiny_model_dir, row_adapters, "cpu", lora_backend="triton", fused_qkv_epilogue=True,
            lora_shrink_in_gemm=True, plan_changes=NARROW | {"grouped_shrink_in_gemm_rows": rows},
        )  # fmt: skip
        launches.clear()
        logits[rows] = prefill_logits(runner, slot_of, names)
        assert bool(launches) == (rows == 0), (rows, len(launches))
    torch.testing.assert_close(logits[NARROW["grouped_shrink_in_gemm_rows"]], logits[0], rtol=2e-5, atol=2e-5)


@pytest.mark.slow(seconds=40)
def test_warm_up_launches_every_variant_of_large_steps_over_a_narrow_span(tiny_family_models, tmp_path):
    base = tiny_family_models["llama-one-layer"]
    adapters = {"plain": build_adapter(base, TINY_ADAPTERS[1], tmp_path / "plain")}  # as row_adapters
    adapters |= {spec.name: build_adapter(base, spec, tmp_path / spec.name) for spec in ROW_KINDS}
    runner, slot_of = tiny_runner(
        base, adapters, "cpu", lora_backend="triton", fused_qkv_epilogue=True,
        lora_shrink_in_gemm=True, max_num_batched_tokens=12, max_num_seqs=3, plan_changes=NARROW,
    )  # fmt: skip
    config = runner.config
    with VariantLog() as warm:  # the prompt steps (a GPU engine's warm-up: its decodes run in graphs)
        warm_up_kernels(
            runner.model, runner.kv_caches, runner.lora, config.max_num_batched_tokens,
            warmup_steps(config, decode_graphs=True),
        )  # fmt: skip
    with VariantLog() as served:
        for names in (["plain"], ["plain", "warm-dora", None], ["warm-bias", None, "plain"]):
            prefill_logits(runner, slot_of, names)
    missing = served.variants - warm.variants
    assert served.variants and not missing, f"{len(missing)} variants not warmed:\n{describe(missing)}"
