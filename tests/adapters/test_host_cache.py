"""Host-RAM adapter tier: LRU capacity, background loads, recorded loader errors, counters."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from multilora_studio.adapters.host_cache import HostAdapterCache
from multilora_studio.adapters.load_latency import LoadQuantiles
from multilora_studio.adapters.peft_adapter import AdapterError, HostAdapter

WAIT_S = 10.0


def make_adapter(name: str, rank: int = 2, path: Path | None = None) -> HostAdapter:
    a = torch.randn(rank, 8)  # [rank, in]
    b = torch.randn(6, rank)  # [out, rank]
    return HostAdapter(
        name, path or Path(f"/adapters/{name}"), rank, 2.0 * rank, ("q_proj",), None, {(0, "q_proj"): (a, b)}
    )


class Loader:
    """A plain loader function with a record of its calls; ``gate`` holds loads back until set."""

    def __init__(self, fail: set[str] | None = None) -> None:
        self.calls: list[tuple[str, Path]] = []
        self.fail = fail or set()
        self.gate = threading.Event()
        self.gate.set()
        self.started = threading.Event()

    def __call__(self, name: str, path: Path) -> HostAdapter:
        self.calls.append((name, path))
        self.started.set()
        assert self.gate.wait(WAIT_S)
        if name in self.fail:
            raise AdapterError(f"{path}/adapter_config.json is missing")
        return make_adapter(name, path=path)


class Ready:
    """``on_ready`` that counts its calls and lets a test wait for the n-th one."""

    def __init__(self) -> None:
        self.count = 0
        self.condition = threading.Condition()

    def __call__(self) -> None:
        with self.condition:
            self.count += 1
            self.condition.notify_all()

    def wait_for(self, n: int) -> None:
        with self.condition:
            assert self.condition.wait_for(lambda: self.count >= n, WAIT_S), f"on_ready called {self.count}x"


@pytest.fixture
def loader() -> Loader:
    return Loader(fail={"broken"})


@pytest.fixture
def ready() -> Ready:
    return Ready()


@pytest.fixture
def cache(loader: Loader, ready: Ready) -> Iterator[HostAdapterCache]:
    cache = HostAdapterCache(3, loader, ready)
    yield cache
    loader.gate.set()
    cache.close()


@pytest.mark.parametrize("capacity", [0, -2])
def test_capacity_must_be_positive(capacity, loader, ready):
    with pytest.raises(ValueError, match="capacity >= 1"):
        HostAdapterCache(capacity, loader, ready)


def test_a_capacity_of_one_keeps_the_latest_adapter(loader, ready):
    cache = HostAdapterCache(1, loader, ready)
    cache.put(make_adapter("a"))
    cache.put(make_adapter("b"))
    assert cache.names() == ["b"]
    cache.close()


def test_put_and_get_keep_at_most_capacity_in_lru_order(cache):
    for name in ("a", "b", "c"):
        cache.put(make_adapter(name))
    assert cache.names() == ["a", "b", "c"]
    assert cache.get("a").name == "a"  # a is now the most recent
    cache.put(make_adapter("d"))
    assert cache.names() == ["c", "a", "d"]
    assert cache.get("b") is None
    replacement = make_adapter("c", rank=4)
    cache.put(replacement)  # same name: replaced and refreshed, nothing evicted
    assert cache.names() == ["a", "d", "c"] and cache.get("c") is replacement
    assert cache.counters.hits == 0 and cache.counters.misses == 0  # get/put do not count


def test_miss_loads_in_the_background_and_calls_on_ready(cache, loader, ready):
    path = Path("/adapters/x")
    loader.gate.clear()
    assert cache.lookup("x", path) is None
    assert loader.started.wait(WAIT_S)  # the load runs while the caller goes on
    assert cache.lookup("x", path) is None  # still loading: no second load, no second miss
    assert ready.count == 0 and cache.get("x") is None
    loader.gate.set()
    ready.wait_for(1)
    adapter = cache.lookup("x", path)
    assert adapter is not None and adapter.name == "x" and adapter.path == path
    assert loader.calls == [("x", path)]
    counters = cache.counters
    assert (counters.hits, counters.misses) == (0, 1), "taking the loaded adapter ends the miss"
    assert cache.lookup("x", path) is adapter
    assert (counters.hits, counters.misses) == (1, 1)
    assert counters.bytes_loaded == adapter.nbytes > 0
    assert len(counters.load_seconds) == 1 and counters.load_seconds[0] > 0
    (seconds,) = counters.load_seconds
    assert counters.adapters.summaries() == {"x": LoadQuantiles(1, seconds, seconds)}
    assert cache.error_of("x") is None


def test_each_lookup_of_a_resident_adapter_counts_one_hit(cache):
    cache.put(make_adapter("a"))
    cache.put(make_adapter("b"))
    for hits in (1, 2, 3):
        assert cache.lookup("a", Path("/a")) is not None
        assert cache.counters.hits == hits
    assert cache.lookup("b", Path("/b")) is not None
    assert (cache.counters.hits, cache.counters.misses) == (4, 0)


def test_loaded_adapters_evict_the_least_recently_used(cache, ready):
    for name in ("a", "b", "c"):
        cache.put(make_adapter(name))
    assert cache.lookup("a", Path("/a")) is not None  # a hit refreshes a
    assert cache.lookup("new", Path("/new")) is None
    ready.wait_for(1)
    assert cache.names() == ["c", "a", "new"]
    assert cache.counters.hits == 1 and cache.counters.misses == 1


def test_loader_errors_are_recorded_reported_and_not_retried(cache, loader, ready):
    assert cache.lookup("broken", Path("/broken")) is None
    ready.wait_for(1)  # a failed load still wakes the engine
    error = cache.error_of("broken")
    assert isinstance(error, AdapterError) and "adapter_config.json is missing" in str(error)
    assert cache.lookup("broken", Path("/broken")) is None
    assert len(loader.calls) == 1 and cache.counters.misses == 1
    assert cache.counters.load_seconds == [] and cache.counters.bytes_loaded == 0
    assert cache.names() == [] and cache.error_of("other") is None
    cache.discard("broken")  # forgetting the adapter forgets the error: a later lookup retries
    assert cache.error_of("broken") is None
    loader.fail.clear()
    assert cache.lookup("broken", Path("/broken")) is None
    ready.wait_for(2)
    assert cache.get("broken") is not None and len(loader.calls) == 2


def test_a_failure_is_retried_once_after_its_files_change(cache, loader, ready, tmp_path):
    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / "adapter_config.json").write_text("{}")
    assert cache.lookup("broken", folder) is None
    ready.wait_for(1)
    assert cache.lookup("broken", folder) is None and cache.error_of("broken") is not None
    assert len(loader.calls) == 1  # unchanged files: the failure holds
    loader.fail.clear()
    loader.gate.clear()
    (folder / "adapter_config.json").write_text('{"r": 8}')  # the repair
    assert cache.error_of("broken") is None
    for _ in range(5):  # a burst of lookups shares one load
        assert cache.lookup("broken", folder) is None
    loader.gate.set()
    ready.wait_for(2)
    assert len(loader.calls) == 2 and cache.get("broken") is not None


def test_an_old_failure_is_retried_even_with_unchanged_files(cache, loader, ready, monkeypatch):
    monkeypatch.setattr("multilora_studio.adapters.host_cache.FAILED_LOAD_TTL_S", 0.0)
    assert cache.lookup("broken", Path("/broken")) is None
    ready.wait_for(1)
    loader.gate.clear()
    assert cache.lookup("broken", Path("/broken")) is None and cache.loading("broken")
    assert cache.lookup("broken", Path("/broken")) is None
    loader.gate.set()
    ready.wait_for(2)
    assert len(loader.calls) == 2


def test_put_clears_a_recorded_error(cache, ready):
    cache.lookup("broken", Path("/broken"))
    ready.wait_for(1)
    assert cache.error_of("broken") is not None
    cache.put(make_adapter("broken"))
    assert cache.error_of("broken") is None
    assert cache.lookup("broken", Path("/broken")) is not None


def test_a_load_overtaken_by_discard_is_dropped(cache, loader, ready):
    loader.gate.clear()
    cache.lookup("x", Path("/old"))
    assert loader.started.wait(WAIT_S)
    cache.discard("x")  # the adapter was removed while it loaded
    loader.gate.set()
    ready.wait_for(1)
    assert cache.get("x") is None and cache.names() == []
    assert cache.counters.load_seconds == []


def test_discard_removes_a_resident_adapter_and_forgets_that_it_was_just_loaded(cache, ready):
    cache.put(make_adapter("kept"))
    assert cache.lookup("x", Path("/x")) is None
    ready.wait_for(1)  # loaded after a miss: its first lookup ends the miss
    cache.discard("x")
    assert cache.get("x") is None and cache.names() == ["kept"]
    cache.put(make_adapter("x"))  # back, but not by that load
    assert cache.lookup("x", Path("/x")) is not None
    assert (cache.counters.hits, cache.counters.misses) == (1, 1)


def test_a_load_overtaken_by_put_does_not_replace_the_newer_adapter(cache, loader, ready):
    loader.gate.clear()
    cache.lookup("x", Path("/old"))
    assert loader.started.wait(WAIT_S)
    newer = make_adapter("x", path=Path("/new"))
    cache.put(newer)
    loader.gate.set()
    ready.wait_for(1)
    assert cache.get("x") is newer


def test_a_failed_load_overtaken_by_put_records_no_error(cache, loader, ready):
    loader.gate.clear()
    cache.lookup("broken", Path("/broken"))
    assert loader.started.wait(WAIT_S)
    cache.put(make_adapter("broken"))
    loader.gate.set()
    ready.wait_for(1)
    assert cache.error_of("broken") is None and cache.get("broken") is not None


def test_loads_of_many_adapters_all_arrive(cache, loader, ready):
    names = [f"ad{i}" for i in range(6)]
    for name in names:
        assert cache.lookup(name, Path(f"/{name}")) is None
    ready.wait_for(len(names))
    assert [name for name, _ in loader.calls] == names  # one loader thread, in order
    assert cache.names() == names[-3:]
    assert cache.counters.misses == 6 and len(cache.counters.load_seconds) == 6


def test_counters_add_up_the_bytes_and_time_each_load_within_its_wall_time(cache, ready):
    names = ["a", "b"]
    started = time.perf_counter()
    for name in names:
        cache.lookup(name, Path(f"/{name}"))
    ready.wait_for(len(names))
    elapsed = time.perf_counter() - started
    loaded = [cache.get(name) for name in names]
    assert cache.counters.bytes_loaded == sum(adapter.nbytes for adapter in loaded) > loaded[0].nbytes
    assert all(0 < seconds <= elapsed for seconds in cache.counters.load_seconds)


def test_close_waits_for_the_running_load(loader, ready):
    cache = HostAdapterCache(2, loader, ready)
    loader.gate.clear()
    cache.lookup("x", Path("/x"))
    assert loader.started.wait(WAIT_S)
    threading.Timer(0.05, loader.gate.set).start()
    cache.close()
    assert ready.count == 1 and cache.get("x") is not None


def test_several_load_workers_load_at_once(ready):
    # Three loads that each wait for the other two: only parallel workers can finish them.
    barrier = threading.Barrier(3, timeout=WAIT_S)

    def loader(name: str, path: Path) -> HostAdapter:
        barrier.wait()
        return make_adapter(name, path=path)

    cache = HostAdapterCache(4, loader, ready, load_workers=3)
    try:
        for name in ("a", "b", "c"):
            assert cache.lookup(name, Path(f"/adapters/{name}")) is None
        ready.wait_for(3)
        assert sorted(cache.names()) == ["a", "b", "c"]
        assert cache.counters.misses == 3 and len(cache.counters.load_seconds) == 3
    finally:
        cache.close()


def test_holds_loading_and_eviction_candidate_change_nothing(cache, loader, ready):
    assert cache.eviction_candidate() is None  # room for three
    cache.put(make_adapter("a"))
    cache.put(make_adapter("b"))
    assert cache.eviction_candidate() is None
    loader.gate.clear()
    assert cache.lookup("c", Path("/c")) is None
    assert loader.started.wait(WAIT_S)
    assert cache.loading("c") and not cache.holds("c") and cache.loads_in_flight == 1
    assert cache.eviction_candidate() == "a"  # two resident + one in flight fill the tier
    assert cache.holds("a") and not cache.loading("a")
    assert (cache.counters.hits, cache.counters.misses) == (0, 1), "peeking counts no hit"
    assert cache.names() == ["a", "b"], "peeking keeps the LRU order"
    loader.gate.set()
    ready.wait_for(1)
    assert cache.holds("c") and not cache.loading("c") and cache.loads_in_flight == 0
    assert cache.eviction_candidate() == "a"


def test_loads_in_flight_take_the_room_they_will_fill(loader, ready):
    """With more loads in flight than the tier has room for, the next load's victim is the
    adapter that the earlier loads leave least recently used, an adapter still loading too."""
    cache = HostAdapterCache(2, loader, ready, load_workers=4)
    try:
        loader.gate.clear()
        assert cache.lookup("a", Path("/a")) is None
        assert cache.eviction_candidate() is None  # one in flight, room for two
        assert cache.lookup("b", Path("/b")) is None
        assert cache.eviction_candidate() == "a"  # nothing resident: "b" loading after "a" fills it
        assert cache.lookup("c", Path("/c")) is None
        assert cache.eviction_candidate() == "b"  # "c" lands on "a"'s place
        loader.gate.set()
        ready.wait_for(3)
        assert len(cache.names()) == 2 and cache.eviction_candidate() == cache.names()[0]
    finally:
        cache.close()


def test_the_tier_counts_the_bytes_it_holds_through_puts_evictions_and_discards():
    cache = HostAdapterCache(2, Loader(), Ready())
    small, large = make_adapter("small", rank=1), make_adapter("large", rank=4)
    other = make_adapter("other", rank=2)
    cache.put(small)
    cache.put(large)
    assert cache.nbytes == small.nbytes + large.nbytes
    cache.put(make_adapter("small", rank=3))  # replaced: its old bytes leave with it
    assert cache.nbytes == large.nbytes + make_adapter("x", rank=3).nbytes
    cache.put(other)  # evicts the least recently used ("large")
    assert cache.names() == ["small", "other"]
    assert cache.nbytes == make_adapter("x", rank=3).nbytes + other.nbytes
    cache.discard("small")
    cache.discard("never-there")
    assert cache.nbytes == other.nbytes
    cache.close()
