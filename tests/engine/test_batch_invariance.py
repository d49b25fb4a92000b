"""Batch-invariant mode: a request's tokens and log-probabilities are the same bits alone, in a
mixed batch and with its prompt chunked across steps while other requests decode."""

from __future__ import annotations

import dataclasses

import pytest

from multilora_studio.bench.random_adapters import write_random_adapter
from multilora_studio.engine import Engine, EngineConfig, SamplingParams
from multilora_studio.engine.model.model_spec import load_spec
from tests.engine.test_fidelity import generate_matches_peft, mixed_requests

TARGET_PROMPT = (
    "The lighthouse keeper climbed the spiral stairs every evening, counting each of the "
    "worn stone steps, and at the top he lit the great lamp while the storm gathered"
)
OTHER_PROMPTS = [
    "Once upon a time",
    "def fibonacci(n):",
    "Paris is the capital of",
    "1, 2, 3,",
    "A short poem about the sea: the waves roll in, the gulls cry",
    "The quick brown fox",
    "Hello",
]
OTHER_ADAPTERS = ["tiny-r4-qv", None, "tiny-r16-mlp", "tiny-r32-ko-down", "tiny-r8-attn", None, "tiny-r8-all"]
NEW_TOKENS = 10
GREEDY = SamplingParams(max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True, logprobs=3, prompt_logprobs=2)
SAMPLED = SamplingParams(
    max_tokens=NEW_TOKENS, temperature=0.9, top_p=0.95, seed=7, ignore_eos=True, logprobs=3, prompt_logprobs=2
)
TARGETS = [("tiny-r8-all", GREEDY), ("tiny-r8-all", SAMPLED), (None, GREEDY), ("tiny-r32-ko-down", SAMPLED)]
CHUNK_BUDGET = 16  # max_num_batched_tokens of the chunked engine: the target's prompt takes several steps
EMBEDDED_NEW_TOKENS = 6  # the target's on the embedded model


def other_params(index: int, new_tokens: int = NEW_TOKENS) -> SamplingParams:
    """The companions' settings: greedy and sampled with their own seeds, three times as long as
    the target's ``new_tokens``."""
    if index % 2:
        return SamplingParams(max_tokens=3 * new_tokens, temperature=0, ignore_eos=True, logprobs=1)
    return SamplingParams(max_tokens=3 * new_tokens, temperature=1.0, seed=100 + index, ignore_eos=True)


def observed(output) -> tuple:
    """Everything the request got back, compared bit for bit (floats compare exactly)."""
    return (output.token_ids, output.logprobs, list(output.prompt_logprobs))


def alone(engine, adapter, params) -> tuple:
    (output,) = engine.generate([TARGET_PROMPT], [adapter], params)
    return observed(output)


def companions(adapters: list[str | None], first: int, last: int) -> list[tuple[int, str, str | None]]:
    """(index, prompt, adapter) of companions first..last-1, adapters taken in turn."""
    return [(i, OTHER_PROMPTS[i], adapters[i % len(adapters)]) for i in range(first, last)]


def in_mixed_batch(engine, adapter, params, adapters: list[str | None] = OTHER_ADAPTERS) -> tuple:
    """The target as the fourth of 8 requests (companions over ``adapters``), one submit."""
    new_tokens = params.max_tokens
    requests = [
        (p, a, other_params(i, new_tokens)) for i, p, a in companions(adapters, 0, len(OTHER_PROMPTS))
    ]
    requests.insert(3, (TARGET_PROMPT, adapter, params))
    streams = engine.submit_many(requests)
    outputs = [stream.result(timeout=120) for stream in streams]
    assert {len(o.token_ids) for i, o in enumerate(outputs) if i != 3} == {3 * new_tokens}
    return observed(outputs[3])


def joining_mid_decode(engine, adapter, params, adapters: list[str | None] = OTHER_ADAPTERS) -> tuple:
    """Companions decode first; the target joins them, its prompt chunked over several steps,
    and more companions join while it decodes."""
    assert len(engine.encode(TARGET_PROMPT)) > CHUNK_BUDGET
    new_tokens = params.max_tokens
    early = [engine.submit(p, a, other_params(i, new_tokens)) for i, p, a in companions(adapters, 0, 3)]
    for stream in early:
        assert next(iter(stream)).token_ids  # each is decoding before the target arrives
    target = engine.submit(TARGET_PROMPT, adapter, params)
    assert next(iter(target)).token_ids  # the target's first token, then more join
    late = [
        engine.submit(p, a, other_params(i, new_tokens))
        for i, p, a in companions(adapters, 3, len(OTHER_PROMPTS))
    ]
    for stream in early + late:
        stream.result(timeout=120)
    return observed(target.result(timeout=120))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_request_is_the_same_bits_alone_batched_and_chunked(make_engine, dtype):
    engine = make_engine(dtype=dtype, batch_invariant=True)
    chunked = make_engine(
        dtype=dtype, batch_invariant=True, max_num_batched_tokens=CHUNK_BUDGET, max_num_seqs=8
    )
    assert engine.runner.model.plan.batch_invariant
    for adapter, params in TARGETS:
        expected = alone(engine, adapter, params)
        assert len(expected[0]) == NEW_TOKENS and all(entry is not None for entry in expected[1])
        assert in_mixed_batch(engine, adapter, params) == expected, (adapter, params.temperature)
        assert joining_mid_decode(chunked, adapter, params) == expected, (adapter, params.temperature)
        assert alone(chunked, adapter, params) == expected, (adapter, params.temperature)


def test_the_invariant_mode_still_matches_peft(make_engine, peft_reference):
    engine = make_engine(batch_invariant=True)
    generate_matches_peft(engine, peft_reference, {}, mixed_requests(engine))


def test_the_default_mode_is_not_batch_invariant(tiny_engine, engine_device):
    """Without the mode the same request gets other bits on the CPU: in the mixed batch its step
    holds more than LoRAPlan.numba_max_tokens tokens, so its LoRA term runs as torch ops instead
    of the Numba kernel. (Whether a chunked prompt's bits differ depends on which steps it
    happens to share, so that case is not asserted here. On CUDA the tiny model's default
    kernels happen to give these requests the same bits: seen on the H200.)"""
    if engine_device != "cpu":
        pytest.skip("the kernel switches this test relies on are the CPU's")
    engine = tiny_engine
    assert not engine.runner.model.plan.batch_invariant
    expected = alone(engine, "tiny-r8-all", GREEDY)
    batched = in_mixed_batch(engine, "tiny-r8-all", GREEDY)
    assert batched[2] != expected[2]  # the prompt's log-probabilities


@pytest.mark.slow(seconds=60)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_embedded_model_is_batch_invariant(default_model, tmp_path, dtype):
    """The same on SmolLM2-135M with two random adapters: alone, batched, chunked (fewer new
    tokens: each step of its 30 layers costs far more than the tiny model's)."""
    spec = load_spec(default_model.path)
    adapters = {f"smol-r8-{i}": write_random_adapter(spec, tmp_path / f"a{i}", 8, seed=i) for i in range(2)}
    settings = dict(
        model=str(default_model.path), device="cpu", dtype=dtype, max_num_seqs=8, max_model_len=256
    )
    with (
        Engine(EngineConfig(**settings, batch_invariant=True)) as engine,
        Engine(
            EngineConfig(**settings, batch_invariant=True, max_num_batched_tokens=CHUNK_BUDGET)
        ) as chunked,
    ):
        for name, path in adapters.items():
            engine.add_adapter(name, path)
            chunked.add_adapter(name, path)
        for adapter, full in (("smol-r8-0", GREEDY), (None, SAMPLED)):
            params = dataclasses.replace(full, max_tokens=EMBEDDED_NEW_TOKENS)
            expected = alone(engine, adapter, params)
            assert in_mixed_batch(engine, adapter, params, ["smol-r8-1", None, "smol-r8-0"]) == expected
            assert joining_mid_decode(chunked, adapter, params, ["smol-r8-1", None, "smol-r8-0"]) == expected


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_other_requests_adapter_strengths_change_nothing(make_engine, dtype):
    """A request at the adapter's own strength keeps its bits when others in its batch scale theirs."""
    engine = make_engine(dtype=dtype, batch_invariant=True)
    expected = alone(engine, "tiny-r8-all", GREEDY)
    scaled = SamplingParams(max_tokens=3 * NEW_TOKENS, temperature=0, ignore_eos=True, adapter_scale=0.5)
    requests = [(p, "tiny-r8-all", scaled) for p in OTHER_PROMPTS[:3]]
    requests.insert(1, (TARGET_PROMPT, "tiny-r8-all", GREEDY))
    outputs = [stream.result(timeout=120) for stream in engine.submit_many(requests)]
    assert observed(outputs[1]) == expected
