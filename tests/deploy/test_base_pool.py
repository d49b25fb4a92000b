"""Several bases in one process: each request runs on its own base's engine and equals PEFT for
its adapter on that base; with room for one base, alternating requests swap it and stay
equal, each base parked in host memory with its engine and adapters (or stopped and started
again), its pins held across the swap either way; a request for a swapped-out base waits for
the one in use, bounded; idle bases swap out."""

from __future__ import annotations

import threading

import pytest

from multilora_studio.deploy import BasePool, BaseUnavailable
from multilora_studio.engine import Engine, EngineConfig, SamplingParams
from tests.engine.reference import PeftReference
from tests.fixtures import AdapterSpec, build_adapter
from tests.threads import CheckedThread, run_threads
from tests.waiting import wait_until

NEW_TOKENS = 10
PROMPTS = [[1, 510, 2300, 44, 901], [1, 40000, 12, 7]]
GREEDY = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
QWEN_ADAPTER = AdapterSpec("qwen-r8", 8, 16, ("q_proj", "v_proj", "down_proj"), 51)


def config(model) -> EngineConfig:
    return EngineConfig(model=str(model), device="cpu", dtype="float32", max_model_len=64, max_lora_rank=8)


@pytest.fixture(scope="module")
def two_bases(tiny_model_dir, tiny_family_models, tiny_adapters, tmp_path_factory):
    """(llama folder, its adapter), (qwen2 folder, its adapter) and what PEFT generates for each."""
    qwen = tiny_family_models["qwen2"]
    qwen_adapter = build_adapter(qwen, QWEN_ADAPTER, tmp_path_factory.mktemp("pool") / "qwen-r8")
    llama_adapter = tiny_adapters["tiny-r8-all"]
    expected = {}
    for base, name, folder in (
        (tiny_model_dir, "tiny-r8-all", llama_adapter),
        (qwen, "qwen-r8", qwen_adapter),
    ):
        reference = PeftReference(base, {name: folder})
        for adapter in (name, None):
            expected[(base.name, adapter)] = [reference.greedy(adapter, p, NEW_TOKENS) for p in PROMPTS]
    return {"llama": (tiny_model_dir, llama_adapter), "qwen": (qwen, qwen_adapter)}, expected


def run(pool: BasePool, model: str) -> list[list[int]]:
    found = pool.base_of(model)
    assert found is not None
    base, adapter = found
    with pool.lease(base) as engine:
        assert engine.model_name == base
        outputs = engine.generate(PROMPTS, [adapter] * len(PROMPTS), GREEDY)
    return [o.token_ids for o in outputs]


def make_pool(two_bases, **options) -> BasePool:
    folders, _ = two_bases
    pool = BasePool([config(folders["llama"][0]), config(folders["qwen"][0])], **options)
    llama, qwen = pool.names
    pool.add_adapter(llama, "tiny-r8-all", folders["llama"][1])
    pool.add_adapter(qwen, "qwen-r8", folders["qwen"][1])
    return pool


def test_interleaved_requests_for_two_bases_each_equal_peft_on_their_base(two_bases):
    folders, expected = two_bases
    with make_pool(two_bases) as pool:
        llama, qwen = pool.names
        assert pool.base_of("qwen-r8") == (qwen, "qwen-r8") and pool.base_of("nope") is None
        order = ["tiny-r8-all", "qwen-r8", llama, qwen, "qwen-r8", "tiny-r8-all"]
        results: dict[str, list] = {}
        run_threads(*(CheckedThread(lambda m=m: results.__setitem__(m, run(pool, m))) for m in order))
        assert results["tiny-r8-all"] == expected[(folders["llama"][0].name, "tiny-r8-all")]
        assert results["qwen-r8"] == expected[(folders["qwen"][0].name, "qwen-r8")]
        assert results[llama] == expected[(folders["llama"][0].name, None)]
        assert results[qwen] == expected[(folders["qwen"][0].name, None)]
        assert [pool.base(name).loads for name in pool.names] == [1, 1]  # colocated: never swapped


def test_with_room_for_one_base_alternating_requests_swap_and_stay_correct(two_bases):
    folders, expected = two_bases
    with make_pool(two_bases, max_resident=1) as pool:
        llama, qwen = pool.names
        for _ in range(2):
            assert run(pool, "qwen-r8") == expected[(folders["qwen"][0].name, "qwen-r8")]
            assert [name for name, _ in pool.resident()] == [qwen]
            assert run(pool, "tiny-r8-all") == expected[(folders["llama"][0].name, "tiny-r8-all")]
            assert [name for name, _ in pool.resident()] == [llama]
        # the adapters came back with each reload
        assert pool.base(qwen).loads == 2 and pool.base(llama).loads == 3


def test_a_request_for_a_swapped_out_base_waits_for_the_one_in_use(two_bases):
    folders, expected = two_bases
    with make_pool(two_bases, max_resident=1) as pool:
        llama, qwen = pool.names
        held = threading.Event()
        release = threading.Event()

        def hold_llama() -> None:
            with pool.lease(llama):
                held.set()
                release.wait(30)

        holder = CheckedThread(hold_llama)
        holder.start()
        assert held.wait(60)
        with pytest.raises(BaseUnavailable, match="waits for other bases' requests"):
            pool.acquire(qwen, timeout=0.3)
        finished: dict[str, object] = {}

        def ask_qwen() -> None:
            finished["tokens"] = run(pool, "qwen-r8")

        waiter = CheckedThread(ask_qwen)
        waiter.start()
        wait_until(lambda: pool.waiting(qwen) == 1, 60, "the qwen request to wait for room")
        assert "tokens" not in finished and pool.resident()[0][0] == llama  # llama has a request
        release.set()
        holder.join(30)
        waiter.join(120)
        assert finished["tokens"] == expected[(folders["qwen"][0].name, "qwen-r8")]
        assert pool.waiting(qwen) == 0


def test_an_idle_base_unloads_after_keep_alive_and_reloads_on_the_next_request(two_bases):
    folders, expected = two_bases
    with make_pool(two_bases, keep_alive_s=0.5) as pool:
        llama, _ = pool.names
        assert run(pool, "tiny-r8-all") == expected[(folders["llama"][0].name, "tiny-r8-all")]
        loads = pool.base(llama).loads
        wait_until(lambda: pool.resident() == [], 30, "the idle base to unload")
        assert pool.base(llama).parked is not None  # swapped out to host memory, engine kept
        assert run(pool, "tiny-r8-all") == expected[(folders["llama"][0].name, "tiny-r8-all")]
        assert pool.base(llama).loads == loads + 1 and pool.base(llama).starts == 1


def test_a_base_that_finishes_loading_after_the_pool_stopped_is_stopped_too(two_bases):
    folders, _ = two_bases
    loading, proceed = threading.Event(), threading.Event()
    made: list[Engine] = []

    def slow_start(engine_config: EngineConfig) -> Engine:
        loading.set()
        assert proceed.wait(60)
        made.append(Engine(engine_config))
        return made[-1]

    pool = BasePool([config(folders["llama"][0])], engine_factory=slow_start)
    refused: list[str] = []

    def ask() -> None:
        with pytest.raises(BaseUnavailable) as error:
            pool.acquire(pool.primary)
        refused.append(str(error.value))

    asking = CheckedThread(ask)
    asking.start()
    assert loading.wait(60)
    pool.shutdown()  # while the base loads (a window restart during a swap)
    proceed.set()
    asking.join(120)
    assert refused == ["the server is stopping"]
    assert pool.resident() == [] and len(made) == 1 and not made[0].running


def test_refusals(two_bases, tiny_model_dir):
    with pytest.raises(ValueError, match="both named"):
        BasePool([config(tiny_model_dir), config(tiny_model_dir)])
    with pytest.raises(ValueError, match="max_resident_bases"):
        BasePool([config(tiny_model_dir)], max_resident=0)
    with make_pool(two_bases) as pool, pytest.raises(ValueError, match="already exists"):
        pool.add_adapter(pool.names[1], "tiny-r8-all", two_bases[0]["llama"][1])


def test_steady_traffic_on_the_loaded_base_does_not_starve_a_swapped_out_one(two_bases):
    folders, expected = two_bases
    with make_pool(two_bases, max_resident=1, load_timeout_s=60) as pool:  # starving would time out
        llama, _ = pool.names
        stop = threading.Event()
        served = []

        def steady() -> None:  # back-to-back requests for llama, two at a time
            while not stop.is_set():
                served.append(run(pool, "tiny-r8-all"))

        workers = [CheckedThread(steady) for _ in range(2)]
        for worker in workers:
            worker.start()
        wait_until(lambda: served, 60, "llama's first answer")
        tokens = run(pool, "qwen-r8")  # waits for llama's requests in flight, not for the traffic
        stop.set()
        for worker in workers:
            worker.join(120)
        assert tokens == expected[(folders["qwen"][0].name, "qwen-r8")]
        assert all(out == expected[(folders["llama"][0].name, "tiny-r8-all")] for out in served)
        assert pool.base(llama).loads >= 2  # llama's traffic went on after the swap back


def test_base_of_finds_adapters_of_loaded_and_swapped_out_bases(two_bases):
    folders, _ = two_bases
    with make_pool(two_bases, max_resident=1) as pool:
        llama, qwen = pool.names
        assert [name for name, _ in pool.resident()] == [qwen]  # its adapter's add loaded it last
        assert pool.base_of("tiny-r8-all") == (llama, "tiny-r8-all")  # kept while swapped out
        assert pool.base_of("qwen-r8") == (qwen, "qwen-r8")
        with pool.lease(qwen) as engine:
            engine.add_adapter("direct", folders["qwen"][1], preload=False)  # added to the engine itself
        assert pool.base_of("direct") == (qwen, "direct")
        pool.remove_adapter("direct")
        assert pool.base_of("direct") is None and pool.base_of("nowhere") is None
        assert pool.base_of(llama) == (llama, None)


def pinned_in_slot(engine, name: str) -> bool:
    snap = engine.metrics(fresh=True)
    return snap is not None and any(slot.adapter == name and slot.pinned for slot in snap.slots)


STOPPED = {"park_memory_fraction": 0}  # swapped-out bases stopped and started again


@pytest.mark.parametrize("options", [{}, STOPPED], ids=["parked", "stopped"])
def test_alternating_swaps_park_each_base_with_its_adapters_or_restart_it(two_bases, options):
    folders, expected = two_bases
    parks = not options
    with make_pool(two_bases, max_resident=1, **options) as pool:
        llama, qwen = pool.names
        turns = [
            ("tiny-r8-all", "llama", llama, "qwen-r8", qwen),
            ("qwen-r8", "qwen", qwen, "tiny-r8-all", llama),
        ]
        engines: dict[str, set[int]] = {llama: set(), qwen: set()}
        stop, unresolved = threading.Event(), set()

        def resolve() -> None:  # every adapter resolves to its base through every swap
            while not stop.is_set():
                for adapter, _, base, _, _ in turns:
                    if pool.base_of(adapter) != (base, adapter):
                        unresolved.add(adapter)

        resolver = CheckedThread(resolve)
        resolver.start()
        for _ in range(2):
            for adapter, family, base, other_adapter, other in turns:
                with pool.lease(base) as engine:
                    engines[base].add(id(engine))
                    out = engine.generate(PROMPTS, [adapter] * len(PROMPTS), GREEDY)
                assert [o.token_ids for o in out] == expected[(folders[family][0].name, adapter)]
                assert [name for name, _ in pool.resident()] == [base]
                assert [name for name, _ in pool.engines()] == ([llama, qwen] if parks else [base])
                parked = pool.base(other).parked  # the other base is off the device
                assert (parked is not None) == parks
                assert parked is None or parked.has_adapter(other_adapter)  # kept by its engine
                assert pool.base_of(other_adapter) == (other, other_adapter)  # still served
        stop.set()
        resolver.join()
        assert not unresolved
        for base in (llama, qwen):
            entry = pool.base(base)
            assert entry.starts == (1 if parks else entry.loads)
            assert len(engines[base]) == 1 or not parks  # parked: the same engine each time


@pytest.mark.parametrize("options", [{}, STOPPED], ids=["parked", "stopped"])
def test_an_adapter_pinned_on_a_base_is_pinned_again_after_a_swap(two_bases, options):
    folders, expected = two_bases
    with make_pool(two_bases, max_resident=1, **options) as pool:
        llama, _ = pool.names
        with pool.lease(llama) as engine:
            engine.pin_adapter("tiny-r8-all")
            wait_until(lambda: pinned_in_slot(engine, "tiny-r8-all"), 60, "the pinned adapter in its slot")
        starts = pool.base(llama).starts
        run(pool, "qwen-r8")  # swaps llama out
        assert llama not in dict(pool.resident())
        with pool.lease(llama) as engine:  # swaps it back in
            assert engine.pinned_adapters() == ["tiny-r8-all"]
            wait_until(lambda: pinned_in_slot(engine, "tiny-r8-all"), 60, "the pinned adapter in its slot")
        assert run(pool, "tiny-r8-all") == expected[(folders["llama"][0].name, "tiny-r8-all")]
        assert pool.base(llama).starts == starts + (1 if options else 0)  # stopped: started again


@pytest.mark.parametrize("options", [{}, STOPPED], ids=["parked", "stopped"])
def test_an_adapter_registered_pinned_on_a_swapped_out_base_is_pinned_once_it_is_in(two_bases, options):
    folders, _ = two_bases
    with make_pool(two_bases, max_resident=1, **options) as pool:
        llama, _ = pool.names
        assert llama not in dict(pool.resident())  # the qwen adapter's add swapped it out
        pool.register_adapter(llama, "llama-pinned", folders["llama"][1], pinned=True)
        assert pool.base_of("llama-pinned") == (llama, "llama-pinned")
        with pool.lease(llama) as engine:
            assert engine.pinned_adapters() == ["llama-pinned"]
            wait_until(lambda: pinned_in_slot(engine, "llama-pinned"), 60, "the pinned adapter in its slot")
