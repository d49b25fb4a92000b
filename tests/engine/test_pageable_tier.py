"""A host tier larger than its pinned blocks: the adapters beyond them stay in pageable memory
and are staged into a pinned block for each upload (CUDA); every adapter still gives its own
tokens. On the CPU there is no pinned memory and the same requests check the plain path."""

from __future__ import annotations

from multilora_studio.engine import SamplingParams

GREEDY = dict(temperature=0, ignore_eos=True)


def test_adapters_beyond_the_pinned_blocks_are_staged_and_give_their_own_tokens(
    make_engine, tiny_adapters, engine_device
):
    names = sorted(tiny_adapters)
    prompts = [f"Harbour {i}" for i in range(2 * len(names))]
    adapters = names + names  # each adapter twice: its second upload reads the host tier
    params = SamplingParams(max_tokens=6, **GREEDY)
    alone = make_engine(adapters=names)
    expected = [o.token_ids for o in alone.generate(prompts, adapters, params)]
    # one slot, one load at a time, a host tier for every adapter: on CUDA the pinned blocks are 2
    # for the tier, 1 for the load, 1 for an upload and 2 kept for staging, so a load takes one
    # while more than two are free (four of the five adapters) and the fifth stays pageable
    engine = make_engine(adapters=[], max_loras=1, max_cpu_loras=len(names), adapter_load_workers=1)
    for name in names:
        engine.add_adapter(name, tiny_adapters[name], preload=False)
    assert [o.token_ids for o in engine.generate(prompts, adapters, params)] == expected
    snapshot = engine.metrics(fresh=True)
    assert set(snapshot.cpu_adapters) == set(names) and snapshot.cpu_misses == len(names)
    if engine_device == "cuda":  # a load found no pinned block to spare: its uploads were staged
        assert snapshot.pinned_blocks_exhausted >= 1
