"""Sampling, stopping, aborting, preemption and bad input on the real engine (tiny model)."""

from __future__ import annotations

import asyncio
import gc
import json
import shutil
import weakref

import pytest
import torch
from safetensors.torch import load_file, save_file

from multilora_studio.adapters.peft_adapter import AdapterError
from multilora_studio.engine import Engine, EngineConfig, EngineStopped, SamplingParams
from multilora_studio.engine.step.device_setup import kv_bytes_per_block
from tests.waiting import wait_until

GREEDY = dict(temperature=0, ignore_eos=True)


def test_seeded_sampling_is_reproducible_and_independent_of_the_batch(tiny_engine):
    engine = tiny_engine
    params = SamplingParams(max_tokens=24, temperature=0.9, top_p=0.95, top_k=50, seed=7, ignore_eos=True)
    alone = engine.generate(["Once upon a time"], ["tiny-r8-all"], params)[0].token_ids
    again = engine.generate(["Once upon a time"], ["tiny-r8-all"], params)[0].token_ids
    crowd = engine.generate(
        ["Once upon a time", "Other prompt here", "Once upon a time"],
        ["tiny-r8-all", None, "tiny-r4-qv"],
        [params, SamplingParams(max_tokens=24, temperature=1.0, seed=1), params],
    )[0].token_ids
    other_seed = engine.generate(
        ["Once upon a time"],
        ["tiny-r8-all"],
        SamplingParams(max_tokens=24, temperature=0.9, seed=8, ignore_eos=True),
    )[0].token_ids
    assert alone == again == crowd
    assert other_seed != alone


def test_the_engine_seed_makes_unseeded_sampling_reproducible(make_engine):
    """Requests without a seed of their own draw one from ``EngineConfig.seed``'s stream."""
    params = SamplingParams(max_tokens=16, temperature=1.0, ignore_eos=True)
    prompts = ["Once upon a time", "Other prompt here", "Once upon a time"]

    def run(seed: int) -> list[list[int]]:
        engine = make_engine(adapters=[], seed=seed)
        tokens = [output.token_ids for output in engine.generate(prompts, None, params)]
        engine.shutdown()
        return tokens

    first, again, other = run(3), run(3), run(4)
    assert first == again
    assert first != other
    assert first[0] != first[2]  # each request has a stream of its own


def test_top_k_one_equals_greedy(tiny_engine):
    engine = tiny_engine
    greedy = engine.generate(["The sea"], ["tiny-r16-mlp"], SamplingParams(max_tokens=16, **GREEDY))[0]
    top1 = engine.generate(
        ["The sea"],
        ["tiny-r16-mlp"],
        SamplingParams(max_tokens=16, temperature=1.5, top_k=1, ignore_eos=True),
    )[0]
    assert top1.token_ids == greedy.token_ids


def test_stop_string_cuts_text_and_streamed_deltas_add_up(tiny_engine):
    engine = tiny_engine
    full = engine.generate(["Once upon a time"], [None], SamplingParams(max_tokens=40, **GREEDY))[0]
    assert len(full.text) > 20
    stop = full.text[12:15]
    cut_at = full.text.find(stop)
    deltas = list(
        engine.stream("Once upon a time", None, SamplingParams(max_tokens=40, stop=[stop], **GREEDY))
    )
    assert deltas[-1].finished and deltas[-1].finish_reason == "stop"
    assert "".join(d.text for d in deltas) == full.text[:cut_at]
    tokens = [t for d in deltas for t in d.token_ids]
    assert tokens == full.token_ids[: len(tokens)] and len(tokens) < 40


def test_stop_token_ends_request_including_that_token(tiny_engine):
    engine = tiny_engine
    full = engine.generate(["Paris is"], ["tiny-r8-attn"], SamplingParams(max_tokens=30, **GREEDY))[0]
    stop_token = full.token_ids[6]
    first = full.token_ids.index(stop_token)
    out = engine.generate(
        ["Paris is"], ["tiny-r8-attn"], SamplingParams(max_tokens=30, stop_token_ids=[stop_token], **GREEDY)
    )[0]
    assert out.finish_reason == "stop"
    assert out.token_ids == full.token_ids[: first + 1]


def test_abort_ends_request_and_frees_its_blocks(tiny_engine):
    engine = tiny_engine
    stream = engine.submit("Once upon a time", "tiny-r4-qv", SamplingParams(max_tokens=200, **GREEDY))
    iterator = iter(stream)
    next(iterator)
    next(iterator)
    engine.abort(stream.request_id)
    rest = list(iterator)
    assert rest[-1].finished and rest[-1].finish_reason == "abort"
    assert len(stream.output.token_ids) < 200
    metrics = engine.metrics(fresh=True)
    assert metrics.kv_blocks_free == metrics.kv_blocks_total
    assert all(slot.in_use == 0 for slot in metrics.slots)


def test_preemption_keeps_greedy_outputs(make_engine, tiny_engine):
    prompts = [f"Story number {i}: once upon a time there was" for i in range(8)]
    adapters = ["tiny-r4-qv", None, "tiny-r8-all", "tiny-r32-ko-down"] * 2
    params = SamplingParams(max_tokens=60, **GREEDY)
    roomy = tiny_engine
    expected = [o.token_ids for o in roomy.generate(prompts, adapters, params)]
    # 20 blocks of 16 tokens: room for a few of the 8 requests of ~75 tokens each
    block_bytes = kv_bytes_per_block(roomy.spec, roomy.config.block_size, torch.float32)
    tight = make_engine(kv_cache_memory_gb=20 * block_bytes / 2**30)
    assert tight.metrics(fresh=True).kv_blocks_total == 20
    outputs = tight.generate(prompts, adapters, params)
    assert [o.token_ids for o in outputs] == expected
    assert tight.metrics(fresh=True).preemptions > 0


def test_async_stream_matches_generate(tiny_engine):
    engine = tiny_engine
    params = SamplingParams(max_tokens=20, **GREEDY)
    expected = engine.generate(["Hello there"], ["tiny-r16-mlp"], params)[0]

    async def collect():
        return [d async for d in engine.astream("Hello there", "tiny-r16-mlp", params)]

    deltas = asyncio.run(collect())
    assert [t for d in deltas for t in d.token_ids] == expected.token_ids
    assert "".join(d.text for d in deltas) == expected.text


def test_chat_messages_use_the_chat_template(tiny_engine):
    engine = tiny_engine
    ids = engine.encode([{"role": "user", "content": "Hi"}])
    text = engine.tokenizer.decode(ids)
    assert "<|im_start|>user\nHi<|im_end|>" in text and text.rstrip().endswith("assistant")


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ("", "empty"),
        ([], "prompt is"),
        ([1, 2, 10**9], "out of range"),
        ([{"role": "user"}], "role"),
        (" ".join(["word"] * 400), "max_model_len"),
    ],
)
def test_bad_prompts_are_refused_clearly(tiny_engine, prompt, message):
    engine = tiny_engine
    with pytest.raises(ValueError, match=message):
        engine.submit(prompt, None, SamplingParams(max_tokens=4))


def test_unknown_adapter_is_an_error_not_the_base(tiny_engine):
    engine = tiny_engine
    with pytest.raises(ValueError, match="unknown adapter 'nope'"):
        engine.submit("Hello", "nope")


def broken_copy(source, target, mutate):
    shutil.copytree(source, target)
    mutate(target)
    return target


def test_bad_adapters_are_refused_and_engine_keeps_serving(make_engine, tiny_adapters, tmp_path):
    engine = make_engine(adapters=["tiny-r8-all"], max_lora_rank=16)
    source = tiny_adapters["tiny-r8-all"]

    def truncate(folder):
        data = (folder / "adapter_model.safetensors").read_bytes()
        (folder / "adapter_model.safetensors").write_bytes(data[: len(data) // 2])

    def nan(folder):
        tensors = load_file(str(folder / "adapter_model.safetensors"))
        first = sorted(tensors)[0]
        tensors[first][0, 0] = float("nan")
        save_file(tensors, str(folder / "adapter_model.safetensors"))

    def pickle_only(folder):
        (folder / "adapter_model.safetensors").rename(folder / "adapter_model.bin")

    def dora(folder):
        config = json.loads((folder / "adapter_config.json").read_text())
        config["use_dora"] = True
        (folder / "adapter_config.json").write_text(json.dumps(config))

    def embed_target(folder):
        config = json.loads((folder / "adapter_config.json").read_text())
        config["target_modules"] = [*config["target_modules"], "embed_tokens"]
        (folder / "adapter_config.json").write_text(json.dumps(config))

    def bad_json(folder):
        (folder / "adapter_config.json").write_text("{")

    cases = {
        "truncate": (truncate, "corrupt or truncated"),
        "nan": (nan, "NaN or Inf"),
        "pickle": (pickle_only, "pickle"),
        "dora": (dora, "DoRA"),
        "embed": (embed_target, "embed_tokens is not supported"),
        "json": (bad_json, "not valid JSON"),
    }
    for label, (mutate, message) in cases.items():
        folder = broken_copy(source, tmp_path / label, mutate)
        with pytest.raises(AdapterError, match=message):
            engine.add_adapter(f"bad-{label}", folder)
    with pytest.raises(AdapterError, match="exceeds max_lora_rank=16"):
        engine.add_adapter("too-big", tiny_adapters["tiny-r32-ko-down"])
    with pytest.raises(ValueError, match="already exists"):
        engine.add_adapter("tiny-r8-all", source)
    assert not {a.name for a in engine.list_adapters()} & {f"bad-{c}" for c in cases}
    out = engine.generate(["Hello"], ["tiny-r8-all"], SamplingParams(max_tokens=5, **GREEDY))[0]
    assert len(out.token_ids) == 5


def test_adapter_of_another_base_model_is_refused(make_engine, tiny_adapters, tmp_path):
    engine = make_engine()

    def widen(folder):
        tensors = load_file(str(folder / "adapter_model.safetensors"))
        widened = {k: (v.repeat(1, 2) if "lora_A" in k else v) for k, v in tensors.items()}
        save_file(widened, str(folder / "adapter_model.safetensors"))

    folder = broken_copy(tiny_adapters["tiny-r4-qv"], tmp_path / "wide", widen)
    with pytest.raises(AdapterError, match="different base model"):
        engine.add_adapter("wide", folder)


def test_remove_adapter_refused_while_in_use_then_succeeds(make_engine):
    engine = make_engine()
    stream = engine.submit("Once upon a time", "tiny-r4-qv", SamplingParams(max_tokens=100, **GREEDY))
    next(iter(stream))
    with pytest.raises(ValueError, match="used by"):
        engine.remove_adapter("tiny-r4-qv")
    engine.abort(stream.request_id)
    stream.result(timeout=60)
    engine.remove_adapter("tiny-r4-qv")
    with pytest.raises(ValueError, match="unknown adapter"):
        engine.submit("Hello", "tiny-r4-qv")


def test_lazily_registered_adapters_load_on_first_use_and_match(make_engine, tiny_adapters, tmp_path):
    eager = make_engine(adapters=["tiny-r8-all", "tiny-r16-mlp"])
    lazy = make_engine(adapters=[])
    for name in ("tiny-r8-all", "tiny-r16-mlp"):
        info = lazy.add_adapter(name, tiny_adapters[name], preload=False)
        assert info.rank == {"tiny-r8-all": 8, "tiny-r16-mlp": 16}[name]
    assert lazy.metrics(fresh=True).cpu_adapters == ()
    params = SamplingParams(max_tokens=12, **GREEDY)
    prompts, names = ["Hello", "Hello", "Hi"], ["tiny-r8-all", "tiny-r16-mlp", None]
    expected = [o.token_ids for o in eager.generate(prompts, names, params)]
    assert [o.token_ids for o in lazy.generate(prompts, names, params)] == expected
    assert set(lazy.metrics(fresh=True).cpu_adapters) == {"tiny-r8-all", "tiny-r16-mlp"}


def test_lazy_adapter_with_bad_weights_fails_its_requests_only(make_engine, tiny_adapters, tmp_path):
    engine = make_engine(adapters=["tiny-r4-qv"])

    def nan(folder):
        tensors = load_file(str(folder / "adapter_model.safetensors"))
        first = sorted(tensors)[0]
        tensors[first][0, 0] = float("nan")
        save_file(tensors, str(folder / "adapter_model.safetensors"))

    folder = broken_copy(tiny_adapters["tiny-r8-all"], tmp_path / "nan", nan)
    engine.add_adapter("nan-later", folder, preload=False)  # header and shapes are fine
    bad, good = engine.generate(
        ["Hello", "Hello"], ["nan-later", "tiny-r4-qv"], SamplingParams(max_tokens=6, **GREEDY)
    )
    assert bad.finish_reason == "error" and "NaN or Inf" in bad.error
    assert good.finish_reason == "length" and len(good.token_ids) == 6
    # a request that arrives while the failure holds fails at once (no load, no step scans it)
    (again,) = engine.generate(["Hello"], ["nan-later"], SamplingParams(max_tokens=6, **GREEDY))
    assert again.finish_reason == "error" and "NaN or Inf" in again.error


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(max_tokens=6, temperature=1e-30, seed=1, ignore_eos=True),
        SamplingParams(max_tokens=6, temperature=0.7, top_p=5e-324, seed=1, ignore_eos=True),
    ],
)
def test_extreme_sampling_values_do_not_fail_the_batch(make_engine, params):
    engine = make_engine(adapters=["tiny-r4-qv"])
    greedy = SamplingParams(max_tokens=6, **GREEDY)
    extreme, neighbour = engine.generate(["Hello", "Other"], [None, "tiny-r4-qv"], [params, greedy])
    assert extreme.finish_reason == "length" and len(extreme.token_ids) == 6
    assert neighbour.finish_reason == "length"
    expected = engine.generate(["Hello"], [None], greedy)[0].token_ids
    assert extreme.token_ids == expected  # the greedy limit of a vanishing temperature / top_p


def test_seed_outside_the_generator_range_is_refused():
    with pytest.raises(ValueError, match="seed"):
        SamplingParams(seed=2**63)


def test_running_is_false_after_shutdown(make_engine):
    engine = make_engine(adapters=[])
    assert engine.running
    engine.shutdown()
    assert not engine.running
    with pytest.raises(EngineStopped, match="shut down"):  # a RuntimeError, as before
        engine.submit("Hello")
    with pytest.raises(EngineStopped):
        engine.abort("any")


def test_cpu_gemm_packing_is_on_by_default_and_can_be_turned_off(make_engine):
    from multilora_studio.kernels.cpu_linear import onednn_packing_available

    if not onednn_packing_available(torch.float32):
        pytest.skip("this torch build has no oneDNN linear packing")
    prompts = ["The capital of France is", [5, 9, 14, 3, 3, 8]]
    adapters = [None, "tiny-r8-all"]
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    packed = make_engine(adapters=["tiny-r8-all"], device="cpu")
    assert packed.runner.model.weights.onednn_packed
    plain = make_engine(adapters=["tiny-r8-all"], device="cpu", cpu_weight_packing=False)
    assert not plain.runner.model.weights.onednn_packed
    got = [o.token_ids for o in packed.generate(prompts, adapters, params)]
    assert got == [o.token_ids for o in plain.generate(prompts, adapters, params)]
    assert all(len(ids) == 24 for ids in got)


def test_prefetch_reads_adapters_into_host_ram_before_their_requests(make_engine, tiny_adapters, tmp_path):
    names = sorted(tiny_adapters)[:3]
    prompts = [f"Ship number {i}" for i in range(len(names))]
    params = SamplingParams(max_tokens=8, **GREEDY)
    expected = [o.token_ids for o in make_engine(adapters=names).generate(prompts, names, params)]

    def nan(folder):
        tensors = load_file(str(folder / "adapter_model.safetensors"))
        first = sorted(tensors)[0]
        tensors[first][0, 0] = float("nan")
        save_file(tensors, str(folder / "adapter_model.safetensors"))

    engine = make_engine(adapters=[], max_loras=2, max_cpu_loras=4)
    for name in names:
        engine.add_adapter(name, tiny_adapters[name], preload=False)
    engine.add_adapter(
        "nan-inside", broken_copy(tiny_adapters[names[0]], tmp_path / "nan", nan), preload=False
    )
    outcome = engine.prefetch_adapters([*names, "nan-inside"], timeout=60)
    assert [outcome[name] for name in names] == [None] * len(names)
    assert "NaN or Inf" in outcome["nan-inside"]
    before = engine.metrics(fresh=True)
    assert set(names) <= set(before.cpu_adapters) and before.cpu_misses == len(names) + 1
    got = engine.generate(prompts, names, params)
    assert [o.token_ids for o in got] == expected
    assert engine.metrics(fresh=True).cpu_misses == before.cpu_misses  # nothing read from disk again
    with pytest.raises(ValueError, match="unknown adapters: nope"):
        engine.prefetch_adapters(["nope"])
    with pytest.raises(ValueError, match="do not fit the host tier of 4"):
        engine.prefetch_adapters([*names, "nan-inside", names[0]])


def test_adapter_waiting_for_a_slot_is_read_into_host_ram_meanwhile(make_engine, tiny_adapters):
    a, b = "tiny-r8-all", "tiny-r16-mlp"
    params = SamplingParams(max_tokens=12, **GREEDY)
    expected = make_engine(adapters=[b]).generate(["Hi"], [b], params)[0].token_ids
    engine = make_engine(adapters=[], max_loras=1, max_cpu_loras=4)
    for name in (a, b):
        engine.add_adapter(name, tiny_adapters[name], preload=False)
    long_run = engine.submit("Hello", a, SamplingParams(max_tokens=200, **GREEDY))
    first = next(iter(long_run))  # `a` holds the only slot from here on
    base_run = engine.submit("Hello", None, SamplingParams(max_tokens=200, **GREEDY))  # base rows too
    waiting = engine.submit("Hi", b, params)
    # the only slot is busy with `a` for 200 tokens; `b` is read from disk in the meantime
    wait_until(
        lambda: b in engine.metrics(fresh=True).cpu_adapters or long_run.output.finish_reason is not None,
        timeout=60,
        what="b in host RAM or the long run done",
    )
    assert b in engine.metrics(fresh=True).cpu_adapters
    assert long_run.output.finish_reason is None, "the host load of b waited for the slot"
    assert waiting.result(timeout=120).token_ids == expected
    assert not first.finished and len(long_run.result(timeout=120).token_ids) == 200
    assert len(base_run.result(timeout=120).token_ids) == 200


def test_the_start_up_heap_is_frozen_while_serving_and_collectable_after_shutdown(
    tiny_model_dir, engine_device
):
    engine = Engine(
        EngineConfig(model=str(tiny_model_dir), device=engine_device, dtype="float32", max_model_len=64)
    )
    assert gc.get_freeze_count() > 10_000  # torch's, transformers' and the model's objects
    assert engine.generate(["Hello"], [None], SamplingParams(max_tokens=2))[0].token_ids
    model = weakref.ref(engine.runner.model)
    engine.shutdown()
    assert gc.get_freeze_count() == 0
    del engine
    gc.collect()
    assert model() is None  # a heap left frozen would keep the stopped engine's model alive


def test_pinning_loads_the_adapter_into_a_slot_without_a_request(make_engine, tiny_adapters):
    engine = make_engine(adapters=[], max_loras=2)
    for name in ("tiny-r4-qv", "tiny-r8-all"):
        engine.add_adapter(name, tiny_adapters[name], preload=False)  # weights read on first use

    def slots() -> dict[str, bool]:
        return {s.adapter: s.pinned for s in engine.metrics(fresh=True).slots if s.adapter is not None}

    assert slots() == {}
    engine.pin_adapter("tiny-r8-all")
    wait_until(lambda: slots() == {"tiny-r8-all": True}, timeout=60)
    params = SamplingParams(max_tokens=4, temperature=0)
    pinned = engine.generate(["Hello"], ["tiny-r8-all"], params)[0]  # served from its slot
    assert pinned.token_ids and engine.metrics(fresh=True).gpu_hits >= 1
    engine.pin_adapter("tiny-r8-all", False)
    assert slots() == {"tiny-r8-all": False}  # unpinning keeps it resident, evictable


def test_queue_time_is_the_wait_before_the_first_step(make_engine):
    engine = make_engine(max_num_seqs=1)  # one request at a time: the second waits for the first
    params = SamplingParams(max_tokens=12, **GREEDY)
    first, second = engine.generate(["Once upon a time", "Other prompt here"], [None, "tiny-r4-qv"], params)
    for output in (first, second):
        assert output.first_scheduled_time is not None and output.first_token_time is not None
        assert output.arrival_time <= output.first_scheduled_time <= output.first_token_time
        assert output.queue_time == output.first_scheduled_time - output.arrival_time
        assert output.ttft is not None and output.queue_time <= output.ttft
    assert second.first_scheduled_time >= first.finish_time
    assert second.queue_time > first.queue_time


def test_a_deep_queue_adds_no_per_step_work_for_each_waiting_request(make_engine):
    """300 requests at once through 4 rows: the load-failure check looks at each request once,
    when it is added, not at every waiting request on every step (about 75 steps here)."""
    engine = make_engine(adapters=["tiny-r4-qv"], max_num_seqs=4)
    tiers = engine.worker.tiers
    looked_up: list[str] = []
    load_error = tiers.load_error

    def counting(name: str):
        looked_up.append(name)
        return load_error(name)

    tiers.load_error = counting
    outputs = engine.generate(["Hi"] * 300, ["tiny-r4-qv"] * 300, SamplingParams(max_tokens=2, **GREEDY))
    assert all(o.finish_reason == "length" for o in outputs)
    assert engine.metrics(fresh=True).steps >= 300 // 4
    assert len(looked_up) == 300
