"""Weighted combinations of adapters equal PEFT's ``add_weighted_adapter`` (linear and cat),
as a new adapter and merged into the base; the ``merge`` command registers what it makes."""

from __future__ import annotations

import json

import pytest
import torch

from multilora_studio.adapters.registry import MERGED_REVISION, Registry
from multilora_studio.cli import main
from multilora_studio.merge import MergeError, combine_adapters
from multilora_studio.paths import HOME_ENV
from tests.engine.reference import greedy_tokens
from tests.fixtures import AdapterSpec, build_adapter
from tests.merge.test_merge_export import NEW_TOKENS, PROMPTS, load_merged

WEIGHTS = (0.7, -0.4)


def peft_with(base, adapters: dict):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    names = list(adapters)
    peft_model = PeftModel.from_pretrained(model, str(adapters[names[0]]), adapter_name=names[0])
    for name in names[1:]:
        peft_model.load_adapter(str(adapters[name]), adapter_name=name)
    return peft_model.eval()


def deltas(peft_model, adapter: str) -> dict[str, torch.Tensor]:
    """Each LoRA layer's delta weight (scale * B @ A) of ``adapter``."""
    found = {}
    for name, module in peft_model.named_modules():
        if hasattr(module, "lora_A") and adapter in module.lora_A:
            found[name] = module.get_delta_weight(adapter).detach().clone()
    return found


@pytest.fixture(scope="module")
def pair(tiny_adapters):
    # both rank 8: q/k/v/o of one, every projection of the other (the modules overlap partly)
    return {"all": tiny_adapters["tiny-r8-all"], "attn": tiny_adapters["tiny-r8-attn"]}


@pytest.mark.parametrize("combination", ["linear", "cat"])
def test_a_weighted_combination_equals_peft_add_weighted_adapter(tiny_model_dir, pair, combination, tmp_path):
    out = combine_adapters(list(pair.values()), WEIGHTS, combination, tmp_path / "combined", num_layers=3)
    reference = peft_with(tiny_model_dir, pair)
    reference.add_weighted_adapter(list(pair), list(WEIGHTS), "combined", combination_type=combination)
    expected = deltas(reference, "combined")
    ours = peft_with(tiny_model_dir, {"ours": out})
    got = deltas(ours, "ours")
    assert set(got) == set(expected) and expected
    for name, delta in expected.items():
        torch.testing.assert_close(got[name], delta, rtol=1e-5, atol=1e-6, msg=name)
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["r"] == config["lora_alpha"] == (8 if combination == "linear" else 16)
    reference.set_adapter("combined")
    for prompt in PROMPTS:
        assert greedy_tokens(ours, prompt, NEW_TOKENS) == greedy_tokens(reference, prompt, NEW_TOKENS)


def test_cat_is_the_weighted_sum_of_the_deltas(tiny_model_dir, pair, tmp_path):
    out = combine_adapters(list(pair.values()), WEIGHTS, "cat", tmp_path / "cat", num_layers=3)
    separate = peft_with(tiny_model_dir, pair)
    parts = [deltas(separate, name) for name in pair]
    combined = deltas(peft_with(tiny_model_dir, {"cat": out}), "cat")
    for name, delta in combined.items():
        expected = sum(w * d.get(name, torch.zeros_like(delta)) for w, d in zip(WEIGHTS, parts, strict=True))
        torch.testing.assert_close(delta, expected, rtol=1e-5, atol=1e-6)


def test_combinations_refuse_what_has_none(tiny_model_dir, tiny_adapters, peft_variants, tmp_path):
    with pytest.raises(MergeError, match="one rank"):
        combine_adapters(
            [tiny_adapters["tiny-r4-qv"], tiny_adapters["tiny-r8-all"]], (1, 1), "linear", tmp_path / "a", 3
        )
    with pytest.raises(MergeError, match="DoRA"):
        combine_adapters(
            [peft_variants["dora"], tiny_adapters["tiny-r4-qv"]], (1, 1), "cat", tmp_path / "b", 3
        )
    with pytest.raises(MergeError, match="one weight per adapter"):
        combine_adapters([tiny_adapters["tiny-r4-qv"]], (1, 2), "cat", tmp_path / "c", 3)
    assert not any(tmp_path.iterdir())


@pytest.fixture
def own_library(tmp_path, monkeypatch) -> Registry:
    """An empty library of this test's own (the command line opens it by its home)."""
    monkeypatch.setenv(HOME_ENV, str(tmp_path / "home"))
    return Registry()


def test_the_merge_command_merges_library_adapters_and_registers_the_results(
    tiny_model_dir, tiny_adapters, pair, tmp_path, capsys, own_library
):
    registry = own_library
    for name in ("tiny-r8-all", "tiny-r8-attn"):
        main(
            [
                "adapters",
                "add",
                str(tiny_adapters[name]),
                "--name",
                f"m-{name}",
                "--model",
                str(tiny_model_dir),
            ]
        )
    out = tmp_path / "merged-two"
    code = main(
        [
            "merge", "m-tiny-r8-all", "m-tiny-r8-attn", "--weights", "0.7,-0.4", "--combination", "cat",
            "--into-base", str(tiny_model_dir), "--out", str(out), "--dtype", "fp32",
        ]
    )  # fmt: skip
    assert code == 0, capsys.readouterr().err
    reference = peft_with(tiny_model_dir, pair)
    reference.add_weighted_adapter(list(pair), list(WEIGHTS), "combined", combination_type="cat")
    reference.set_adapter("combined")
    merged = load_merged(out)
    for prompt in PROMPTS:
        assert greedy_tokens(merged, prompt, NEW_TOKENS) == greedy_tokens(reference, prompt, NEW_TOKENS)
    (record,) = [b for b in registry.list_base_models() if b.repo_id == "merged-two"]
    assert record.revision == MERGED_REVISION and record.path == out.resolve()
    origin = json.loads(record.origin)
    assert [a["name"] for a in origin["adapters"]] == ["m-tiny-r8-all", "m-tiny-r8-attn"]
    assert origin["combination"] == "cat" and "sha256:" in capsys.readouterr().out

    # the same name again is refused before anything is written
    assert main(["merge", "m-tiny-r8-all", "--into-base", str(tiny_model_dir), "--out", str(tmp_path / "x"),
                 "--name", "merged-two"]) != 0  # fmt: skip
    assert "choose another name" in capsys.readouterr().err and not (tmp_path / "x").exists()

    # --as-adapter adds the combination to the library, served like any adapter
    code = main(
        [
            "merge", "m-tiny-r8-all", "m-tiny-r8-attn", "--weights", "0.5,0.5", "--as-adapter",
            "--into-base", str(tiny_model_dir), "--out", str(tmp_path / "half-half"), "--name", "half-half",
        ]
    )  # fmt: skip
    assert code == 0
    combined = registry.get("half-half")
    assert combined.rank == 8 and "linear combination of m-tiny-r8-all x 0.5" in combined.notes


def test_merging_a_retrained_base_adapter_is_refused_unless_allowed(
    tiny_model_dir, retrained_base, tmp_path, capsys, own_library
):
    spec = AdapterSpec("other", 4, 8, ("q_proj",), 41)
    folder = build_adapter(retrained_base, spec, tmp_path / "other")
    main(["adapters", "add", str(folder), "--name", "on-other-base", "--model", str(retrained_base)])
    args = ["merge", "on-other-base", "--into-base", str(tiny_model_dir), "--out", str(tmp_path / "m")]
    assert main(args) != 0
    assert "validated against other base weights" in capsys.readouterr().err
    assert main([*args, "--allow-other-base"]) == 0
