"""A failed adapter load is not remembered past a repair: the next request reads the files again, once."""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest
import torch
from safetensors.torch import load_file, save_file

from multilora_studio.engine import SamplingParams
from tests.server_fixtures import GREEDY, client

NAME = "repairable"
WEIGHTS = "adapter_model.safetensors"


def _corrupt(weights: Path) -> None:
    """Same header and size, one tensor NaN: the load (not the header check) refuses it."""
    tensors = load_file(str(weights))
    first = sorted(tensors)[0]
    tensors[first] = torch.full_like(tensors[first], float("nan"))
    save_file(tensors, str(weights))


def _ask(server) -> str:
    reply = client(server).completions.create(model=NAME, prompt="Sea", max_tokens=8, **GREEDY)
    return reply.choices[0].text


def _burst(server, count: int) -> list[object]:
    """``count`` requests at once: each one's text, or the error it raised."""

    def one(_: int) -> object:
        try:
            return _ask(server)
        except openai.APIError as error:
            return error

    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(one, range(count)))


def test_a_repaired_adapter_loads_on_the_next_request(serve, engine, server_adapters, tmp_path):
    folder = tmp_path / NAME
    shutil.copytree(server_adapters["tiny-r8-all"], folder)
    original = (folder / WEIGHTS).read_bytes()
    _corrupt(folder / WEIGHTS)
    engine.add_adapter(NAME, folder, preload=False)  # header only, as `serve` adds library adapters
    counters = engine.catalog.host_tier.cache.counters
    try:
        server = serve()
        with pytest.raises(openai.InternalServerError) as caught:
            _ask(server)
        message = caught.value.body["message"]
        assert NAME in message and "NaN" in message and str(tmp_path) not in message
        loads = counters.misses
        failed = _burst(server, 4)  # files unchanged: the failure holds, nothing is read again
        assert all(isinstance(e, openai.InternalServerError) for e in failed), failed
        assert counters.misses == loads

        (folder / WEIGHTS).write_bytes(original)
        answers = _burst(server, 4)
        assert all(isinstance(a, str) for a in answers), answers
        assert counters.misses == loads + 1  # one load shared by the burst
        expected = engine.generate(
            ["Sea"], ["tiny-r8-all"], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
        )[0].text
        assert answers == [expected] * 4
    finally:
        engine.remove_adapter(NAME)
