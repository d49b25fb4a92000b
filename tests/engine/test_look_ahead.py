"""Look-ahead loading: queued requests' adapters are read into host RAM before admission, in
arrival order, never pushing out an adapter that a queued request waits for."""

from __future__ import annotations

from multilora_studio.engine import SamplingParams
from tests.waiting import wait_until

GREEDY = dict(temperature=0, ignore_eos=True)
QUEUED = ("tiny-r4-qv", "tiny-r8-all", "tiny-r16-mlp", "tiny-r8-attn")
PARAMS = SamplingParams(max_tokens=6, **GREEDY)
PROMPTS = [f"Ship {i}" for i in range(len(QUEUED))]
LONG = 60_000  # tokens of the requests that hold the batch's rows


def queue_behind_a_full_batch(make_engine, tiny_adapters, host_tier: int, load_workers: int):
    """Each queued adapter's tokens alone, then an engine of two rows, ``host_tier`` host
    slots and ``load_workers`` loads at once whose rows are taken by long base requests, with
    one request per ``QUEUED`` adapter queued behind them: (expected tokens, engine, the long
    streams, the queued streams)."""
    alone = make_engine(adapters=list(QUEUED))
    expected = [o.token_ids for o in alone.generate(PROMPTS, list(QUEUED), PARAMS)]
    # the long requests outlast the loads on any device (a GPU runs 4,000 of the tiny model's
    # steps in a few seconds, less than eight loader processes take to start on a busy host)
    rows = dict(max_loras=2, max_num_seqs=2, max_model_len=LONG + 16)
    engine = make_engine(adapters=[], max_cpu_loras=host_tier, adapter_load_workers=load_workers, **rows)
    for name in QUEUED:
        engine.add_adapter(name, tiny_adapters[name], preload=False)
    long = SamplingParams(max_tokens=LONG, **GREEDY)  # aborted by the test once it has seen the loads
    busy = [engine.submit(f"Hello {i}", None, long) for i in range(2)]
    for stream in busy:
        next(iter(stream))  # running from here on
    queued = [engine.submit(p, name, PARAMS) for p, name in zip(PROMPTS, QUEUED, strict=True)]
    return expected, engine, busy, queued


def wait_for_host_tier(engine, names, busy) -> None:
    wait_until(
        lambda: set(names) <= set(engine.metrics(fresh=True).cpu_adapters) or busy[0].output.finish_reason,
        timeout=60,
        what=f"{', '.join(names)} in host RAM, or the batch done",
    )


def test_queued_adapters_are_read_ahead_in_arrival_order_while_the_batch_is_full(make_engine, tiny_adapters):
    # one load at a time, so the host tier's order is the order the loads started in
    expected, engine, busy, queued = queue_behind_a_full_batch(make_engine, tiny_adapters, 6, load_workers=1)
    wait_for_host_tier(engine, QUEUED, busy)
    snapshot = engine.metrics(fresh=True)
    assert all(s.output.finish_reason is None for s in busy), "the loads waited for free rows"
    assert [n for n in snapshot.cpu_adapters if n in QUEUED] == list(QUEUED)  # read in arrival order
    assert snapshot.cpu_misses == len(QUEUED) and snapshot.cpu_capacity == 6
    assert all(stream.output.finish_reason is None for stream in queued)  # none admitted yet
    for stream in busy:
        engine.abort(stream.request_id)
    assert [s.result(timeout=120).token_ids for s in queued] == expected
    assert engine.metrics(fresh=True).cpu_misses == len(QUEUED)  # each read from disk once


def test_look_ahead_stops_where_it_would_push_out_a_queued_requests_adapter(make_engine, tiny_adapters):
    # four loads at once for a tier of two: the loads in flight count against its room
    expected, engine, busy, queued = queue_behind_a_full_batch(make_engine, tiny_adapters, 2, load_workers=4)
    wait_for_host_tier(engine, QUEUED[:2], busy)
    for _ in range(3):  # each round trip is a turn of the worker's loop, with its look-ahead
        snapshot = engine.metrics(fresh=True)
    assert all(s.output.finish_reason is None for s in busy)
    assert set(snapshot.cpu_adapters) == set(QUEUED[:2]) and snapshot.cpu_misses == 2
    for stream in busy:
        engine.abort(stream.request_id)
    assert [s.result(timeout=120).token_ids for s in queued] == expected
