"""Each adapter's output in a mixed batch equals PEFT's output for that adapter alone."""

from __future__ import annotations

import pytest

from multilora_studio.engine import SamplingParams
from tests.engine.test_model_families import new_tokens
from tests.fixtures import TINY_ADAPTERS

NEW_TOKENS = 32
PROMPTS = [
    "Once upon a time",
    "The quick brown fox jumps over the lazy dog and then",
    "def fibonacci(n):",
    "Paris is the capital of",
    "A short poem about the sea: the waves roll in, the gulls cry, and the sand",
    "1, 2, 3,",
]
GREEDY = SamplingParams(max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True)


def mixed_requests(engine) -> list[tuple[list[int], str | None]]:
    """Every adapter and the base, each with a prompt of a different length."""
    names: list[str | None] = [spec.name for spec in TINY_ADAPTERS] + [None]
    return [(engine.encode(PROMPTS[i % len(PROMPTS)]), name) for i, name in enumerate(names * 2)]


@pytest.fixture(scope="module")
def expected_cache():
    return {}


def expected(peft_reference, cache, prompt_ids, adapter):
    key = (tuple(prompt_ids), adapter)
    if key not in cache:
        cache[key] = peft_reference.greedy(adapter, prompt_ids, NEW_TOKENS)
    return cache[key]


def generate_matches_peft(engine, peft_reference, cache, requests, max_tokens: int = NEW_TOKENS) -> None:
    """One batched ``generate`` of ``requests``, ``max_tokens`` each; each output equals PEFT's
    (its first ``max_tokens``) for its adapter alone."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    outputs = engine.generate([p for p, _ in requests], [a for _, a in requests], params)
    for (prompt_ids, adapter), output in zip(requests, outputs, strict=True):
        assert output.finish_reason == "length"
        wanted = expected(peft_reference, cache, prompt_ids, adapter)[:max_tokens]
        assert output.token_ids == wanted, adapter


# The LoRA shrink by the kernels, and inside the base GEMMs (every slot's A rows appended).
SHRINK_PATHS = pytest.mark.parametrize(
    "shrink_in_gemm", [False, True], ids=["kernel-shrink", "shrink-in-gemm"]
)


@SHRINK_PATHS
def test_mixed_batch_matches_peft_token_for_token(
    make_engine, peft_reference, expected_cache, shrink_in_gemm
):
    engine = make_engine(lora_shrink_in_gemm=shrink_in_gemm)
    assert bool(engine.runner.lora.shrink_in_gemm_weights) == shrink_in_gemm
    generate_matches_peft(engine, peft_reference, expected_cache, mixed_requests(engine))


def test_adapters_change_the_output(tiny_engine, peft_reference, expected_cache):
    engine = tiny_engine
    prompt = engine.encode(PROMPTS[0])
    outputs = {
        spec.name: expected(peft_reference, expected_cache, prompt, spec.name) for spec in TINY_ADAPTERS
    }
    base = expected(peft_reference, expected_cache, prompt, None)
    assert all(tokens != base for tokens in outputs.values()), "every fixture adapter must matter"


@SHRINK_PATHS
def test_requests_joining_mid_decode_match_peft(make_engine, peft_reference, expected_cache, shrink_in_gemm):
    engine = make_engine(lora_shrink_in_gemm=shrink_in_gemm)
    requests = mixed_requests(engine)
    first, later = requests[::2], requests[1::2]
    streams = [engine.submit(p, a, GREEDY) for p, a in first]
    for stream in streams[:2]:  # wait until decoding is under way
        next(iter(stream))
    streams += [engine.submit(p, a, GREEDY) for p, a in later]
    ordered = first + later
    for (prompt_ids, adapter), stream in zip(ordered, streams, strict=True):
        assert stream.result(timeout=120).token_ids == expected(
            peft_reference, expected_cache, prompt_ids, adapter
        ), adapter


def test_fused_qkv_epilogue_matches_peft(make_engine, peft_reference, expected_cache, engine_device):
    """The q/k/v expand, RoPE and cache write as one kernel (fused_qkv_epilogue=True, with the
    shrink in the GEMMs so the kernel does the expand; under TRITON_INTERPRET=1 on the CPU, as
    the test suite runs). Every adapter and the base once, fewer tokens in the interpreter."""
    engine = make_engine(lora_shrink_in_gemm=True, fused_qkv_epilogue=True)
    assert engine.runner.model.plan.fused_qkv
    requests = mixed_requests(engine)[: len(TINY_ADAPTERS) + 1]
    count = new_tokens("fused-qkv", engine_device, NEW_TOKENS)
    generate_matches_peft(engine, peft_reference, expected_cache, requests, count)


@SHRINK_PATHS
def test_more_adapters_than_slots_evicts_and_reloads_correctly(
    make_engine, peft_reference, expected_cache, shrink_in_gemm
):
    engine = make_engine(max_loras=2, max_cpu_loras=2, max_num_seqs=4, lora_shrink_in_gemm=shrink_in_gemm)
    requests = mixed_requests(engine)
    # Two rounds: the second finds at most two of the five adapters still in a slot (and in
    # host RAM), so at least three are evicted and loaded again, whatever order the first ran in.
    for _ in range(2):
        generate_matches_peft(engine, peft_reference, expected_cache, requests)
    metrics = engine.metrics(fresh=True)
    assert metrics is not None
    assert metrics.gpu_misses >= len(TINY_ADAPTERS) + 3, "adapters must have been evicted and reloaded"
    # two slots and two host entries hold at most four of the five: one at least is read again
    assert metrics.cpu_misses > len(TINY_ADAPTERS), "the CPU tier must have been too small for all"


def test_a_batch_in_the_first_slots_multiplies_only_their_a_rows_and_matches_peft(
    make_engine, peft_reference, expected_cache
):
    """With the shrink in the GEMM, a step whose adapters sit in the first slots multiplies the
    A rows of the next power of two of slots only; each row is still PEFT's. Then a fourth
    adapter lands in slot 3 and the span grows to cover it."""
    names = [spec.name for spec in TINY_ADAPTERS]
    engine = make_engine(adapters=names, max_loras=8, lora_shrink_in_gemm=True)
    runner = engine.runner
    lora = runner.lora
    assert [lora.slot_span(slot) for slot in (0, 1, 2, 3, 4, 7)] == [1, 2, 4, 4, 8, 8]
    assert lora.shrink_in_gemm_rows("qkv", 2) == lora.offsets["qkv"][-1] + 2 * 3 * lora.max_rank
    spans: list[int] = []
    prepare = runner.prepare

    def recording(plan, blocks, slot_of):
        inputs = prepare(plan, blocks, slot_of)
        spans.append(inputs.slot_span)
        return inputs

    runner.prepare = recording  # the worker calls it once a step; it records what each step used
    two = [(engine.encode(PROMPTS[i]), name) for i, name in enumerate([names[0], None, names[1]])]
    generate_matches_peft(engine, peft_reference, expected_cache, two)
    assert {engine.worker.tiers.slots.slot_of(name) for name in names[:2]} == {0, 1}
    assert max(spans) == 2 and set(spans) <= {0, 1, 2}, spans  # 0, 1: steps before both arrived
    spans.clear()
    four = [(engine.encode(PROMPTS[i]), name) for i, name in enumerate(names[:4])]
    generate_matches_peft(engine, peft_reference, expected_cache, four)
    assert max(spans) == 4, spans
