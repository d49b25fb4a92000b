"""Adapter files crafted to hang, crash or overflow validation are refused with a clear error."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from multilora_studio.adapters.peft_adapter import AdapterError, load_peft_adapter
from tests.adapter_fixtures import edit_config
from tests.server.raw_http import call, post_json
from tests.threads import CheckedThread

# Backtracks exponentially in Python's re (the test would hang), matched at once by `regex`.
NESTED_QUANTIFIER = "m(.+)+Z"
# Backtracks exponentially in `regex` too: only the timeout stops it.
ALTERNATION_BLOWUP = r"(\w|[a-z]|_|\.)+\d"


def load(folder: Path, tiny_base):
    return load_peft_adapter("x", folder, tiny_base.num_layers, tiny_base.shape_of, 16, tiny_base.vocab)


def copy(folder: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(folder, tmp_path / "adapter"))


def ranks_and_factors(host) -> dict:
    return {key: (a.shape[0], b) for key, (a, b) in host.weights.items()}


@pytest.mark.timeout(60)
def test_nested_quantifier_pattern_matches_in_bounded_time_with_peft_semantics(
    peft_variants, tiny_base, tmp_path
):
    expected = ranks_and_factors(load(peft_variants["rank_pattern"], tiny_base))
    folder = copy(peft_variants["rank_pattern"], tmp_path)
    edit_config(folder, rank_pattern={NESTED_QUANTIFIER: 4, "v_proj": 8})
    got = ranks_and_factors(load(folder, tiny_base))
    assert got.keys() == expected.keys()
    for key, (rank, b) in got.items():
        assert rank == expected[key][0]
        assert b.equal(expected[key][1])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("field", ["rank_pattern", "alpha_pattern"])
def test_catastrophic_pattern_is_refused_naming_the_key(field, peft_variants, tiny_base, tmp_path):
    folder = copy(peft_variants[field], tmp_path)
    edit_config(folder, **{field: {ALTERNATION_BLOWUP: 4}})
    with pytest.raises(AdapterError, match=rf"{field} key .* took too long to match; simplify it"):
        load(folder, tiny_base)


def test_overlong_pattern_key_is_refused(peft_variants, tiny_base, tmp_path):
    folder = copy(peft_variants["rank_pattern"], tmp_path)
    edit_config(folder, rank_pattern={"q_proj|" * 60 + "v_proj": 8})
    with pytest.raises(AdapterError, match=r"rank_pattern key .* longer than 256 characters"):
        load(folder, tiny_base)


@pytest.mark.parametrize(
    ("case", "change"),
    [
        ("rank_pattern", {"lora_alpha": 1e38}),
        ("alpha_pattern", {"alpha_pattern": {"o_proj": 1e38}}),
        ("rslora", {"lora_alpha": 3e37}),
    ],
)
def test_an_alpha_whose_scale_overflows_is_refused_naming_lora_alpha(
    case, change, peft_variants, tiny_base, tmp_path
):
    folder = copy(peft_variants[case], tmp_path)
    load(folder, tiny_base)  # the adapter itself is fine
    edit_config(folder, **change)
    with pytest.raises(AdapterError, match=r"lora_alpha .* overflow float32; lora_alpha is too large"):
        load(folder, tiny_base)


@pytest.mark.timeout(120)
def test_a_hostile_pattern_over_http_is_a_400_while_the_server_keeps_answering(
    serve, peft_variants, tmp_path, engine
):
    folder = copy(peft_variants["rank_pattern"], tmp_path)
    edit_config(folder, rank_pattern={ALTERNATION_BLOWUP: 4})
    server = serve()
    answer: dict[str, object] = {}

    def load_it() -> None:
        body = {"lora_name": "hostile", "lora_path": str(folder)}
        answer["reply"] = post_json(server.url, "/v1/load_lora_adapter", body)

    loader = CheckedThread(load_it)
    loader.start()
    health = []
    while loader.is_alive():  # validation runs off the event loop: /health answers throughout
        health.append(call(server.url, "GET", "/health")[0])
    loader.join()
    status, _, body = answer["reply"]
    assert status == 400 and "rank_pattern key" in body["error"]["message"]
    assert "took too long to match" in body["error"]["message"]
    assert health and set(health) == {200}
    assert "hostile" not in {info.name for info in engine.list_adapters()}
