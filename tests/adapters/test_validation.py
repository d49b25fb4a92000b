"""Every bad adapter is refused with a message naming the problem, and leaves the library as it was."""

from __future__ import annotations

import json
import math
import re
import shutil
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from multilora_studio.adapters.adapter_config import (
    CONFIG_FILE,
    MAX_CONFIG_BYTES,
    SUPPORTED_TARGETS,
    parse_adapter_config,
    read_adapter_config,
)
from multilora_studio.adapters.peft_adapter import (
    MAX_ADAPTER_BYTES,
    AdapterError,
    inspect_peft_adapter,
    load_peft_adapter,
    lora_gain,
    peak,
    weights_file,
)
from multilora_studio.engine.model.model_spec import spec_from_config
from tests.adapter_fixtures import edit_config, edit_tensors
from tests.fixtures import FUSED_ADAPTERS, AdapterSpec, build_adapter

GOOD = "tiny-r8-all"  # rank 8 on all seven projections
FIRST_A = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
FIRST_B = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"


def weights(folder: Path) -> Path:
    return folder / "adapter_model.safetensors"


def rewrite_header(folder: Path, change) -> None:
    """Edit the JSON header of the safetensors file in place (data bytes untouched)."""
    raw = weights(folder).read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + length])
    change(header)
    encoded = json.dumps(header).encode()
    weights(folder).write_bytes(struct.pack("<Q", len(encoded)) + encoded + raw[8 + length :])


def truncate(folder: Path) -> None:
    data = weights(folder).read_bytes()
    weights(folder).write_bytes(data[: len(data) // 2])


def set_value(key: str, value: float):
    def change(tensors: dict) -> None:
        tensors[key][0, 0] = value

    return change


def add_tensor(key: str, shape: tuple[int, ...]):
    def change(tensors: dict) -> None:
        tensors[key] = torch.randn(shape)

    return change


# output rows of each projection of the tiny model (hidden 64, 2 of 4 heads for k/v, MLP 160)
OUT_FEATURES = {
    "q_proj": 64,
    "k_proj": 32,
    "v_proj": 32,
    "o_proj": 64,
    "gate_proj": 160,
    "up_proj": 160,
    "down_proj": 64,
}


def add_vectors(suffix: str, short_module: str):
    """A per-row vector (DoRA's magnitude, lora_B's bias) on every projection of every layer,
    one row short on ``short_module`` (``""``: none)."""

    def change(tensors: dict) -> None:
        for layer in range(3):
            for module, rows in OUT_FEATURES.items():
                block = "self_attn" if module in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
                key = f"base_model.model.model.layers.{layer}.{block}.{module}.{suffix}"
                tensors[key] = torch.rand(rows - (module == short_module)) + 0.5

    return change


def drop_tensor(key: str):
    def change(tensors: dict) -> None:
        del tensors[key]

    return change


def rename_tensor(old: str, new: str):
    def change(tensors: dict) -> None:
        tensors[new] = tensors.pop(old)

    return change


def add_fused_qkv_beside_q(folder: Path) -> None:
    """LoRA on layer 0's fused qkv_proj (phi3's name) next to its q_proj LoRA: a double term on q."""
    rank = load_file(str(weights(folder)))[FIRST_A].shape[0]
    fused = FIRST_A.replace("q_proj", "qkv_proj")
    edit_tensors(folder, add_tensor(fused, (rank, 64)))
    edit_tensors(folder, add_tensor(fused.replace("lora_A", "lora_B"), (128, rank)))
    target_modules = json.loads((folder / "adapter_config.json").read_text())["target_modules"]
    edit_config(folder, target_modules=[*target_modules, "qkv_proj"])


def reshape_first_a(tensors: dict) -> None:
    tensors[FIRST_A] = tensors[FIRST_A].repeat(1, 2)


def widen_first_b(tensors: dict) -> None:
    tensors[FIRST_B] = tensors[FIRST_B].repeat(2, 1)


def int_first_a(tensors: dict) -> None:
    tensors[FIRST_A] = tensors[FIRST_A].to(torch.int32)


def scale_factors(a_value: float, b_value: float):
    """Every lora_A entry set to ``a_value`` and every lora_B entry to ``b_value``."""

    def change(tensors: dict) -> None:
        for key, tensor in tensors.items():
            if ".lora_A." in key or ".lora_B." in key:
                tensor.fill_(a_value if ".lora_A." in key else b_value)

    return change


def first_a_in_three_dimensions(tensors: dict) -> None:
    tensors[FIRST_A] = tensors[FIRST_A].unsqueeze(-1)  # [r, in] -> [r, in, 1], lora_B left as it is


def first_pair_at_rank(rank: int):
    """The first q_proj's factors at ``rank`` (the config still declares the adapter's r)."""

    def change(tensors: dict) -> None:
        tensors[FIRST_A] = torch.randn(rank, tensors[FIRST_A].shape[1])
        tensors[FIRST_B] = torch.randn(tensors[FIRST_B].shape[0], rank)

    return change


CASES = {
    # files and their bytes
    "truncated": (truncate, "corrupt or truncated"),
    "shorter_than_header": (
        lambda f: weights(f).write_bytes(b"\x10\x00"),
        "shorter than a safetensors header",
    ),
    "huge_header_length": (
        lambda f: weights(f).write_bytes(struct.pack("<Q", 1 << 60) + weights(f).read_bytes()[8:]),
        r"declares a \d+-byte header",
    ),
    "header_not_json": (
        lambda f: weights(f).write_bytes(struct.pack("<Q", 4) + b"{no}" + b"\x00" * 64),
        "header is not valid JSON",
    ),
    "huge_declared_shape": (
        lambda f: rewrite_header(f, lambda h: h[FIRST_A].update(shape=[1 << 40, 64])),
        "declares shape",
    ),
    "offsets_past_the_end": (
        lambda f: rewrite_header(f, lambda h: h[FIRST_A].update(data_offsets=[0, 1 << 33])),
        "corrupt or truncated",
    ),
    "unknown_dtype": (
        lambda f: rewrite_header(f, lambda h: h[FIRST_A].update(dtype="Q4")),
        "unknown dtype",
    ),
    "no_weights": (lambda f: weights(f).unlink(), "has no adapter_model.safetensors"),
    "pickle_only": (lambda f: weights(f).rename(f / "adapter_model.bin"), "pickle files can run code"),
    "no_tensors": (lambda f: save_file({}, str(weights(f))), "holds no LoRA tensors"),
    # tensor values and names
    "nan": (lambda f: edit_tensors(f, set_value(FIRST_A, math.nan)), "NaN or Inf"),
    "inf": (lambda f: edit_tensors(f, set_value(FIRST_B, math.inf)), "NaN or Inf"),
    "integer_factors": (lambda f: edit_tensors(f, int_first_a), "LoRA factors are floats"),
    "dora_tensors": (
        lambda f: edit_tensors(
            f, add_tensor("base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector", (64,))
        ),
        r"has lora_magnitude_vector \(DoRA\), which adapter_config.json does not declare",
    ),
    "dora_magnitude_shape": (
        lambda f: (
            edit_config(f, use_dora=True),
            edit_tensors(f, add_vectors("lora_magnitude_vector", "v_proj")),
        ),
        r"v_proj has a lora_magnitude_vector \(DoRA\) of shape \[31\]; the base model needs \[32\]\. The "
        "adapter was trained on a different base model$",
    ),
    "lora_bias_shape": (
        lambda f: (edit_config(f, lora_bias=True), edit_tensors(f, add_vectors("lora_B.bias", "gate_proj"))),
        r"gate_proj has a lora_B bias of shape \[159\]; the base model needs \[160\]\. The adapter was "
        "trained on a different base model$",
    ),
    "lm_head_weights": (
        lambda f: edit_tensors(f, add_tensor("base_model.model.lm_head.weight", (8, 64))),
        r"lm_head.weight' has shape \[8, 64\]; the base model needs \[V, 64\] with V >= its vocabulary "
        "of 49152",
    ),
    "resized_embeddings": (
        lambda f: edit_tensors(f, add_tensor("base_model.model.model.embed_tokens.weight", (8, 64))),
        r"embed_tokens.weight' has shape \[8, 64\]",
    ),
    "bias_terms": (
        lambda f: edit_tensors(f, add_tensor("base_model.model.model.layers.0.self_attn.q_proj.bias", (64,))),
        "trained bias terms",
    ),
    "missing_lora_b": (lambda f: edit_tensors(f, drop_tensor(FIRST_B)), "lacks its lora_B"),
    "fused_and_its_part": (  # q, k and v all beside it: the first in order is named
        add_fused_qkv_beside_q,
        r"layer 0 has LoRA on both qkv_proj and k_proj, which it contains; an adapter targets either "
        "the fused projection or its parts$",
    ),
    "rank_differs_from_config": (lambda f: edit_config(f, r=4), "declares r=4"),
    "wrong_in_features": (lambda f: edit_tensors(f, reshape_first_a), "different base model"),
    "three_dimensional_a": (
        lambda f: edit_tensors(f, first_a_in_three_dimensions),
        r"layer 0 q_proj has A \[8, 64, 1\] and B \[64, 8\]; the base model needs A \[r, 64\] and "
        r"B \[64, r\]",
    ),
    "factors_above_the_rank_cap": (
        lambda f: edit_tensors(f, first_pair_at_rank(80)),
        r"layer 0 q_proj has rank 80 > max_lora_rank=64",
    ),
    "wrong_out_features": (lambda f: edit_tensors(f, widen_first_b), "different base model"),
    "more_layers_than_base": (
        lambda f: edit_tensors(f, rename_tensor(FIRST_A, FIRST_A.replace("layers.0.", "layers.7."))),
        "another base model",
    ),
    "layer_at_the_layer_count": (  # layers 0-2 exist: 3 is one past the last
        lambda f: edit_tensors(f, rename_tensor(FIRST_A, FIRST_A.replace("layers.0.", "layers.3."))),
        r"is for layer 3, the base model has 3 layers; was it trained on another base model\?$",
    ),
    "two_model_paths": (
        lambda f: edit_tensors(
            f,
            rename_tensor(
                FIRST_A, FIRST_A.replace("model.model.layers", "model.model.language_model.layers")
            ),
        ),
        r"LoRA tensors under more than one model path: model, model.language_model$",
    ),
    "two_kinds_undeclared": (
        lambda f: (
            edit_tensors(f, add_vectors("lora_magnitude_vector", "")),
            edit_tensors(f, add_vectors("lora_B.bias", "")),
        ),
        r"layer 0 down_proj has lora_B bias, lora_magnitude_vector \(DoRA\), which adapter_config.json "
        "does not declare$",
    ),
    "two_kinds_missing": (
        lambda f: (
            edit_config(f, use_dora=True),
            edit_tensors(f, add_vectors("lora_magnitude_vector", "")),
            edit_tensors(f, drop_tensor(FIRST_A)),
            edit_tensors(f, drop_tensor(FIRST_B)),
        ),
        r"layer 0 q_proj lacks its lora_A, lora_B tensor$",
    ),
    "tensor_outside_target_modules": (
        lambda f: edit_config(f, target_modules=["q_proj"]),
        "not in target_modules",
    ),
    "added_tokens": (
        lambda f: (f / "added_tokens.json").write_text(json.dumps({"<new>": 49152})),
        r"adds tokens \('<new>'\) outside its vocabulary of 49152; an adapter that adds tokens must hold "
        "its resized embed_tokens and lm_head",
    ),
    "resized_head_only": (
        lambda f: (
            edit_tensors(f, add_tensor("base_model.model.lm_head.weight", (49160, 64))),
            edit_tensors(f, add_tensor("base_model.model.model.embed_tokens.weight", (49156, 64))),
        ),
        r"embed_tokens and lm_head have different vocabularies \(\[49156, 49160\]\)",
    ),
    "trainable_tokens_without_rows": (
        lambda f: edit_config(f, trainable_token_indices=[5, 6]),
        r"adapter_config.json declares trainable_token_indices \(embed_tokens\), but the weights hold no",
    ),
    "trainable_rows_count": (
        lambda f: (
            edit_config(f, trainable_token_indices=[5, 6]),
            edit_tensors(
                f,
                add_tensor(
                    "base_model.model.model.embed_tokens.token_adapter.trainable_tokens_delta", (3, 64)
                ),
            ),
        ),
        r"has shape \[3, 64\]; its 2 trainable tokens need \[2, 64\]",
    ),
    "trainable_ids_outside": (
        lambda f: (
            edit_config(f, trainable_token_indices=[5, 60000]),
            edit_tensors(
                f,
                add_tensor(
                    "base_model.model.model.embed_tokens.token_adapter.trainable_tokens_delta", (2, 64)
                ),
            ),
        ),
        r"trainable_token_indices of embed_tokens has ids outside the vocabulary of 49152: \[60000\]",
    ),
    "modules_to_save_missing": (
        lambda f: edit_config(f, modules_to_save=["lm_head"]),
        r"declares modules_to_save \(lm_head\), but the weights hold no embed_tokens / lm_head tensor",
    ),
    "modules_to_save_other": (
        lambda f: edit_config(f, modules_to_save=["score"]),
        r"modules_to_save names 'score'; only embed_tokens and lm_head are served",
    ),
    # adapter_config.json schema
    "config_bad_json": (lambda f: (f / "adapter_config.json").write_text("{"), "not valid JSON"),
    "config_not_object": (lambda f: (f / "adapter_config.json").write_text("[1]"), "must hold a JSON object"),
    "config_missing": (lambda f: (f / "adapter_config.json").unlink(), "has no adapter_config.json"),
    "config_huge": (
        lambda f: (f / "adapter_config.json").write_text(" " * (2 << 20) + "{}"),
        "larger than 1 MiB",
    ),
    "r_not_integer": (lambda f: edit_config(f, r="8"), "'r' must be a positive integer"),
    "r_zero": (lambda f: edit_config(f, r=0), "'r' must be a positive integer"),
    "alpha_nan": (lambda f: edit_config(f, lora_alpha=math.nan), "'lora_alpha' must be a finite number"),
    "alpha_bool": (lambda f: edit_config(f, lora_alpha=True), "'lora_alpha' must be a finite number"),
    "targets_empty": (lambda f: edit_config(f, target_modules=[]), "non-empty list"),
    "targets_bad_regex": (lambda f: edit_config(f, target_modules="(q_proj"), "not a valid regex"),
    "target_unsupported": (
        lambda f: edit_config(f, target_modules=["q_proj", "conv1d"]),
        "conv1d is not supported",
    ),
    "rank_pattern_not_mapping": (lambda f: edit_config(f, rank_pattern=[8]), "'rank_pattern' must map"),
    "alpha_pattern_text": (
        lambda f: edit_config(f, alpha_pattern={"q_proj": "x"}),
        "'alpha_pattern' must map",
    ),
    "prefix_tuning": (lambda f: edit_config(f, peft_type="PREFIX_TUNING"), "only LoRA adapters"),
    "classification_task": (lambda f: edit_config(f, task_type="SEQ_CLS"), "task_type SEQ_CLS"),
    "rslora_text": (lambda f: edit_config(f, use_rslora="yes"), "'use_rslora' must be true or false"),
    "fan_in_fan_out": (lambda f: edit_config(f, fan_in_fan_out=True), "fan_in_fan_out"),
    "layers_to_transform_text": (
        lambda f: edit_config(f, layers_to_transform="all"),
        "'layers_to_transform'",
    ),
    "dora_flag": (
        lambda f: edit_config(f, use_dora=True),
        r"lacks its lora_magnitude_vector \(DoRA\) tensor",
    ),
    "dora_and_bias": (lambda f: edit_config(f, use_dora=True, lora_bias=True), "PEFT refuses it"),
    "bias_flag": (lambda f: edit_config(f, lora_bias=True), "lacks its lora_B bias tensor"),
    "embedding_target": (
        lambda f: edit_config(f, target_modules=["q_proj", "embed_tokens"]),
        "embedding LoRA",
    ),
    "alpha_gain_too_large": (  # scale 1e33: the bound on A x B's output passes float16's
        lambda f: edit_config(f, lora_alpha=8e33),  # range, while B x scale still fits float32
        r"lora_alpha \(or its alpha_pattern\) gives scale 1e\+33, and the scaled factors overflow "
        "float32; lora_alpha is too large$",
    ),
    "b_times_scale_overflows": (  # tiny A keeps the output bound small; B x scale passes float32
        lambda f: (edit_config(f, lora_alpha=8e9), edit_tensors(f, scale_factors(1e-10, 1e30))),
        r"gives scale 1e\+09, and the scaled factors overflow float32; lora_alpha is too large$",
    ),
    "rank_pattern_too_large": (
        lambda f: edit_config(f, rank_pattern={"q_proj": 128}),
        "rank 128 exceeds max_lora_rank=64",
    ),
}

PEFT_CASES = {
    "embedding": r"embed_tokens is not supported \(embedding LoRA\)",
    "lm_head": r"lm_head is not supported \(lm_head LoRA\)",
}


def assert_refused(registry, folder: Path, base, message: str, **options) -> None:
    """The import fails with ``message`` and the library holds exactly what it held before."""
    before = registry.list_adapters()
    folders_before = sorted(registry.adapters_dir.iterdir())
    with pytest.raises(AdapterError, match=message) as caught:
        registry.import_folder(folder, base, name="candidate", **options)
    assert str(folder) in str(caught.value)
    assert registry.list_adapters() == before
    assert sorted(registry.adapters_dir.iterdir()) == folders_before


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_adapter_is_refused_and_nothing_is_registered(case, registry, tiny_adapters, tiny_base, tmp_path):
    kept = registry.import_folder(tiny_adapters["tiny-r4-qv"], tiny_base, name="kept")
    mutate, message = CASES[case]
    folder = shutil.copytree(tiny_adapters[GOOD], tmp_path / case)
    mutate(folder)
    assert_refused(registry, folder, tiny_base, message)
    assert registry.get("kept") == kept
    assert (kept.path / "adapter_model.safetensors").is_file()


@pytest.mark.parametrize("case", sorted(PEFT_CASES))
def test_peft_saved_unsupported_contents_are_named(case, registry, peft_variants, tiny_base):
    assert_refused(registry, peft_variants[case], tiny_base, PEFT_CASES[case])


def test_rank_above_the_limit_is_refused(registry, tiny_adapters, tiny_base):
    assert_refused(
        registry, tiny_adapters["tiny-r32-ko-down"], tiny_base, "exceeds max_lora_rank=16", max_rank=16
    )
    record = registry.import_folder(tiny_adapters["tiny-r32-ko-down"], tiny_base, max_rank=32)
    assert record.rank == 32


def test_pickle_next_to_safetensors_is_ignored_and_not_copied(registry, tiny_adapters, tiny_base, tmp_path):
    folder = shutil.copytree(tiny_adapters["tiny-r4-qv"], tmp_path / "with-pickle")
    (folder / "training_args.bin").write_bytes(b"\x80\x04not loaded")
    record = registry.import_folder(folder, tiny_base)
    assert sorted(p.name for p in record.path.iterdir()) == [
        "README.md",
        "adapter_config.json",
        "adapter_model.safetensors",
    ]


def raw_factors(folder: Path) -> dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]:
    tensors = load_file(str(weights(folder)))
    out = {}
    for key, a in tensors.items():
        if ".lora_A." in key:
            parts = key.split(".")
            layer, module = int(parts[parts.index("layers") + 1]), parts[-3]
            out[(layer, module)] = (a, tensors[key.replace(".lora_A.", ".lora_B.")])
    return out


@pytest.mark.parametrize(
    ("case", "targets", "scales"),
    [
        ("regex_targets", ("q_proj", "v_proj"), {"q_proj": 2.0, "v_proj": 2.0}),
        ("alpha_pattern", ("q_proj", "o_proj"), {"q_proj": 2.0, "o_proj": 8.0}),
        ("rslora", ("up_proj",), {"up_proj": 4.0}),
        ("rank_pattern", ("q_proj", "v_proj"), {"q_proj": 2.0, "v_proj": 1.0}),
        ("some_layers", ("down_proj",), {"down_proj": 2.0}),
    ],
)
def test_accepted_peft_variants_fold_peft_scales(case, targets, scales, peft_variants, tiny_base):
    folder = peft_variants[case]
    host = load_peft_adapter(case, folder, tiny_base.num_layers, tiny_base.shape_of, 16, tiny_base.vocab)
    assert host.targets == targets
    raw = raw_factors(folder)
    assert set(host.weights) == set(raw)
    for (layer, module), (a, b_scaled) in host.weights.items():
        raw_a, raw_b = raw[(layer, module)]
        torch.testing.assert_close(a, raw_a)
        torch.testing.assert_close(b_scaled, raw_b * scales[module])
    if case == "rank_pattern":
        assert host.rank == 8 and {
            a.shape[0] for (_, m), (a, _) in host.weights.items() if m == "q_proj"
        } == {4}
    if case == "some_layers":
        assert {layer for layer, _ in host.weights} == {1}


@pytest.mark.parametrize(("case", "kind"), [("dora", "DoRA"), ("rank_pattern", "LoRA")])
def test_peft_saved_dora_is_registered_with_its_kind(
    case, kind, registry, peft_variants, tiny_base, tmp_path
):
    """A DoRA adapter PEFT saved imports, and the library keeps its kind across a reopen."""
    record = registry.import_folder(peft_variants[case], tiny_base, name=f"kind-{case}")
    assert record.kind == kind
    reopened = type(registry)(registry.root)
    assert reopened.get(f"kind-{case}").kind == kind


def test_vision_tower_and_token_tensors_are_not_taken_for_factors(tiny_adapters, tiny_base, tmp_path):
    """An image-text model's vision-tower LoRA is left out and trainable-token rows go to the
    token tables; every factor after them in the file is still read."""
    folder = shutil.copytree(tiny_adapters[GOOD], tmp_path / "with-others")
    vision = "base_model.model.vision_tower.encoder.layers.0.self_attn.q_proj"
    edit_tensors(folder, add_tensor(f"{vision}.lora_A.weight", (8, 32)))
    edit_tensors(folder, add_tensor(f"{vision}.lora_B.weight", (32, 8)))
    token_rows = "base_model.model.model.embed_tokens.token_adapter.trainable_tokens_delta"
    edit_tensors(folder, add_tensor(token_rows, (2, 64)))  # sorts before every layer's factors
    edit_config(folder, trainable_token_indices=[5, 6])
    host, plain = (
        load_peft_adapter(f.name, f, tiny_base.num_layers, tiny_base.shape_of, 16, tiny_base.vocab)
        for f in (folder, tiny_adapters[GOOD])
    )
    assert set(host.weights) == set(plain.weights) and len(plain.weights) == 3 * 7
    for key, (a, b) in plain.weights.items():
        torch.testing.assert_close(host.weights[key][0], a)
        torch.testing.assert_close(host.weights[key][1], b)


def test_a_rank_pattern_for_one_layer_takes_that_layers_factors(registry, tiny_adapters, tiny_base, tmp_path):
    """A rank_pattern key naming one layer's module by its whole path holds for that layer only."""
    folder = shutil.copytree(tiny_adapters[GOOD], tmp_path / "layer-rank")
    a_key, b_key = (key.replace("layers.0.", "layers.1.") for key in (FIRST_A, FIRST_B))

    def second_q_at_rank_4(tensors: dict) -> None:
        tensors[a_key] = tensors[a_key][:4].clone()  # [8, in] -> [4, in]
        tensors[b_key] = tensors[b_key][:, :4].clone()  # [out, 8] -> [out, 4]

    edit_tensors(folder, second_q_at_rank_4)
    edit_config(folder, rank_pattern={"model.layers.1.self_attn.q_proj": 4})
    host = load_peft_adapter(
        "layer-rank", folder, tiny_base.num_layers, tiny_base.shape_of, 16, tiny_base.vocab
    )
    assert [host.weights[(layer, "q_proj")][0].shape[0] for layer in range(3)] == [8, 4, 8]
    edit_config(folder, rank_pattern={"model.layers.2.self_attn.q_proj": 4})  # the wrong layer
    assert_refused(
        registry, folder, tiny_base, "layer 1 q_proj has rank 4 but adapter_config.json declares r=8"
    )


def test_an_alpha_pattern_for_one_layer_scales_only_that_layer():
    config = parse_adapter_config(
        {
            "peft_type": "LORA",
            "r": 8,
            "lora_alpha": 16,
            "target_modules": ["q_proj"],
            "alpha_pattern": {"model.layers.1.self_attn.q_proj": 32},
        },
        "adapter_config.json",
        16,
    )
    assert [config.scale_of(layer, "q_proj", 8, "model") for layer in (0, 1, 2)] == [
        2.0,
        4.0,
        2.0,
    ]  # alpha / r


def test_lora_gain_is_the_largest_output_of_inputs_within_one():
    a = torch.full((3, 5), 2.0)  # [rank, in]
    b = torch.full((4, 3), -0.25)  # [out, rank], scaled by 2 below
    largest = (torch.ones(1, 5) @ a.T @ (2 * b).T).abs().max()  # every entry at its largest: x = 1
    assert lora_gain(a, peak(a), peak(b), 2.0) == pytest.approx(float(largest)) == 15.0
    x = torch.randint(0, 2, (64, 5)).float() * 2 - 1  # other inputs of |x| <= 1 stay below the bound
    a, b = torch.randn(3, 5), torch.randn(4, 3)
    assert float((x @ a.T @ (-3 * b).T).abs().max()) <= lora_gain(a, peak(a), peak(b), -3.0)
    assert peak(torch.tensor([1.0, -7.0, 3.0])) == 7.0 and peak(torch.empty(0)) == 0.0
    for bad in (float("nan"), float("inf"), -float("inf")):
        assert math.isnan(peak(torch.tensor([1.0, bad])))


def plain_lora(**fields: object) -> dict:
    """A raw config of a rank-8 LoRA on q_proj, with ``fields`` over it."""
    return {"peft_type": "LORA", "r": 8, "target_modules": ["q_proj"], **fields}


@pytest.mark.parametrize(
    ("rank", "accepted"), [(1, True), (2, True), (0, False), (2.5, False), (True, False)]
)
def test_a_rank_pattern_takes_positive_integers_only(rank, accepted):
    raw = plain_lora(lora_alpha=16)
    raw["rank_pattern"] = {"q_proj": rank}
    if accepted:
        assert parse_adapter_config(raw, "adapter_config.json", 16).rank_of(0, "q_proj", "model") == rank
    else:
        with pytest.raises(AdapterError, match="rank_pattern"):
            parse_adapter_config(raw, "adapter_config.json", 16)


def test_a_config_naming_only_the_rank_and_targets_is_a_plain_lora():
    """PEFT's defaults stand in for the fields a config leaves out (``peft_type`` among them)."""
    config = parse_adapter_config({"r": 4, "target_modules": ["v_proj", "q_proj"]}, "adapter_config.json", 16)
    assert (config.rank, config.alpha, config.targets) == (4, 4.0, ("q_proj", "v_proj"))
    flags = (config.use_rslora, config.use_dora, config.lora_bias, config.base_model)
    assert flags == (False, False, False, None)
    assert config.kind == "LoRA"
    assert config.scale_of(0, "q_proj", 4, "model") == 1.0  # lora_alpha defaults to r


def test_a_pattern_key_may_be_256_characters_long_and_no_longer():
    raw = plain_lora()
    longest = "a" * 250 + "q_proj"  # 256 characters
    raw["rank_pattern"] = {longest: 4}
    assert parse_adapter_config(raw, "adapter_config.json", 16).rank_pattern == {longest: 4}
    raw["rank_pattern"] = {"a" + longest: 4}
    with pytest.raises(AdapterError) as refused:
        parse_adapter_config(raw, "adapter_config.json", 16)
    # the message names the key by its first 40 characters
    assert str(refused.value) == (
        f"adapter_config.json: rank_pattern key '{'a' * 40}'... is longer than 256 characters"
    )


def test_a_pattern_key_naming_the_mlp_matches_only_mlp_projections():
    raw = plain_lora(target_modules=["q_proj", "up_proj"])
    raw["rank_pattern"] = {"layers.0.mlp.up_proj": 4, "self_attn.up_proj": 2}
    config = parse_adapter_config(raw, "adapter_config.json", 16)
    ranks = [config.rank_of(layer, module, "model") for layer in (0, 1) for module in ("up_proj", "q_proj")]
    assert ranks == [4, 8, 8, 8]  # up_proj is in model.layers.0.mlp, q_proj in self_attn


def test_a_pattern_past_its_time_budget_is_refused_naming_the_key():
    raw = plain_lora(rank_pattern={"q_proj": 4})
    config = parse_adapter_config(raw, "adapter_config.json", 16)
    config.budget[0] = 0.0  # spent: the next match, however quick, ends it
    with pytest.raises(AdapterError) as refused:
        config.rank_of(0, "q_proj", "model")
    assert str(refused.value) == "rank_pattern key 'q_proj' took too long to match; simplify it"


def test_modules_to_save_must_be_a_list():
    raw = plain_lora(modules_to_save="lm_head")
    with pytest.raises(AdapterError) as refused:
        parse_adapter_config(raw, "adapter_config.json", 16)
    expected = "adapter_config.json: 'modules_to_save' must be a list of module names or null"
    assert str(refused.value) == expected


WHERE = "adapter_config.json"


def tokens_of(indices: object) -> dict[str, tuple[int, ...]]:
    raw = plain_lora(trainable_token_indices=indices)
    return parse_adapter_config(raw, WHERE, 16).trainable_tokens


def test_trainable_token_indices_as_a_list_or_by_module():
    assert tokens_of([0, 7]) == {"embed_tokens": (0, 7)}  # id 0 is a token too
    by_module = {"model.embed_tokens": [3], "lm_head": [0, 2]}
    assert tokens_of(by_module) == {"embed_tokens": (3,), "lm_head": (0, 2)}
    assert tokens_of(None) == tokens_of([]) == {}


@pytest.mark.parametrize(
    ("indices", "message"),
    [
        (5, "'trainable_token_indices' must be a list of token ids or a dict"),
        ({"embed_tokens": []}, "trainable_token_indices of 'embed_tokens' must be token ids (>= 0)"),
        ({"embed_tokens": 5}, "trainable_token_indices of 'embed_tokens' must be token ids (>= 0)"),
        ([4, -1], "trainable_token_indices of 'embed_tokens' must be token ids (>= 0)"),
        ([4, 2.0], "trainable_token_indices of 'embed_tokens' must be token ids (>= 0)"),
        ({"lm_head": [4, 9, 4]}, "trainable_token_indices of 'lm_head' repeats a token id"),
        (
            {"score": [1]},
            "trainable_token_indices names 'score'; only embed_tokens and lm_head are served "
            "(other fully trained modules are not)",
        ),
    ],
)
def test_bad_trainable_token_indices_are_refused_with_their_message(indices, message):
    with pytest.raises(AdapterError) as refused:
        tokens_of(indices)
    assert str(refused.value) == f"{WHERE}: {message}"


def test_read_adapter_config_refuses_a_file_and_takes_a_config_of_exactly_its_limit(tmp_path):
    not_a_folder = tmp_path / "adapter.bin"
    not_a_folder.write_bytes(b"")
    with pytest.raises(AdapterError) as refused:
        read_adapter_config(not_a_folder)
    assert str(refused.value) == f"{not_a_folder} is not a folder"
    body = json.dumps({"r": 4, "target_modules": ["q_proj"]})
    (tmp_path / CONFIG_FILE).write_text(body + " " * (MAX_CONFIG_BYTES - len(body)))  # the limit
    assert read_adapter_config(tmp_path) == {"r": 4, "target_modules": ["q_proj"]}
    (tmp_path / CONFIG_FILE).write_text(body + " " * (MAX_CONFIG_BYTES + 1 - len(body)))
    with pytest.raises(AdapterError, match="is larger than 1 MiB"):
        read_adapter_config(tmp_path)


def test_read_adapter_config_refuses_json_nested_past_the_parser(tmp_path):
    (tmp_path / CONFIG_FILE).write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(AdapterError) as refused:
        read_adapter_config(tmp_path)
    assert str(refused.value) == f"{tmp_path / CONFIG_FILE}: JSON nested too deeply"


def targets_of(targets: object) -> tuple[str, ...] | None:
    raw = plain_lora(target_modules=targets)
    return parse_adapter_config(raw, WHERE, 16).targets


def test_target_modules_by_full_path_are_their_projection_in_the_models_order():
    given = ["model.layers.0.mlp.down_proj", "v_proj", "gate_proj", "model.layers.3.self_attn.q_proj"]
    named = {"down_proj", "v_proj", "gate_proj", "q_proj"}
    expected = tuple(name for name in SUPPORTED_TARGETS if name in named)
    assert expected != tuple(sorted(expected))  # the model's order is not the alphabet's
    assert targets_of(given) == expected


def test_unsupported_target_modules_are_named_with_what_is_supported():
    supported = f"(supported: {', '.join(SUPPORTED_TARGETS)})"
    with pytest.raises(AdapterError) as refused:
        targets_of(["q_proj", "score", "model.classifier"])
    assert str(refused.value) == f"{WHERE}: LoRA on classifier, score is not supported {supported}"
    with pytest.raises(AdapterError) as refused:
        targets_of(["lm_head", "q_proj", "model.embed_tokens"])
    assert str(refused.value) == (
        f"{WHERE}: LoRA on embed_tokens, lm_head is not supported (embedding LoRA, lm_head LoRA) {supported}"
    )


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("peft_type", 1, "a string"),
        ("task_type", ["CAUSAL_LM"], "a string or null"),
        ("use_rslora", "yes", "true or false"),
        ("use_dora", 1, "true or false"),
        ("lora_bias", "false", "true or false"),
        ("base_model_name_or_path", 7, "a string or null"),
    ],
)
def test_a_field_of_the_wrong_type_is_named_with_the_type_it_takes(key, value, expected):
    raw = plain_lora(**{key: value})
    with pytest.raises(AdapterError) as refused:
        parse_adapter_config(raw, WHERE, 16)
    assert str(refused.value) == f"{WHERE}: '{key}' must be {expected}, got {value!r}"


def test_a_task_other_than_text_generation_is_refused_saying_which_are_served():
    raw = {"peft_type": "lora", "task_type": "SEQ_CLS", "r": 8, "target_modules": ["q_proj"]}
    with pytest.raises(AdapterError) as refused:
        parse_adapter_config(raw, WHERE, 16)
    assert str(refused.value) == (
        f"{WHERE}: task_type SEQ_CLS is not supported; "
        "only CAUSAL_LM (text generation) adapters can be served"
    )


def test_rank_one_is_a_rank_and_bad_patterns_are_named_with_what_they_map_to():
    raw = plain_lora(r=1)
    assert parse_adapter_config(raw, WHERE, 16).rank == 1
    for key, value, expected in [
        ("rank_pattern", {"q_proj": 0}, "positive integers"),
        ("alpha_pattern", {"q_proj": "16"}, "finite numbers"),
    ]:
        with pytest.raises(AdapterError) as refused:
            parse_adapter_config({**raw, key: value}, WHERE, 16)
        assert str(refused.value) == f"{WHERE}: '{key}' must map module names to {expected}"


def test_every_unsupported_content_of_a_config_is_named():
    raw = plain_lora(layer_replication=[[0, 1]])
    raw["use_qalora"] = True
    with pytest.raises(AdapterError) as refused:
        parse_adapter_config(raw, WHERE, 16)
    assert str(refused.value) == f"{WHERE}: unsupported adapter contents: layer replication, QA-LoRA"


def test_a_rank_above_the_cap_names_the_flag_to_raise():
    raw = plain_lora(rank_pattern={"q_proj": 32})
    with pytest.raises(AdapterError) as refused:
        parse_adapter_config(raw, WHERE, 16)
    assert str(refused.value) == (
        f"{WHERE}: rank 32 exceeds max_lora_rank=16; raise max_lora_rank to use this adapter"
    )


@pytest.mark.parametrize(
    ("layers", "accepted"),
    [(2, True), ([0, 2], True), (None, True), ([0, "1"], False), ("0", False), (1.0, False)],
)
def test_layers_to_transform_takes_an_integer_or_a_list_of_them(layers, accepted):
    raw = plain_lora(layers_to_transform=layers)
    if accepted:
        assert parse_adapter_config(raw, WHERE, 16).rank == 8
        return
    with pytest.raises(AdapterError) as refused:
        parse_adapter_config(raw, WHERE, 16)
    assert str(refused.value) == f"{WHERE}: 'layers_to_transform' must be an integer or a list of integers"


SUPPORTED = ", ".join(SUPPORTED_TARGETS)
UNSUPPORTED_TENSORS = {
    "embedding_lora": (
        "base_model.model.model.embed_tokens.lora_embedding_A",
        "embedding LoRA (embed_tokens)",
    ),
    "lm_head_lora": ("base_model.model.lm_head.lora_A.weight", "lm_head LoRA"),
    "norm_bias": (
        "base_model.model.model.norm.bias",
        "trained bias terms other than lora_B's (base_model.model.model.norm.bias)",
    ),
    "lora_on_a_router": (  # a module whose own name starts with lora_ is named whole
        "base_model.model.model.layers.0.mlp.lora_router.lora_A.weight",
        f"LoRA on base_model.model.model.layers.0.mlp.lora_router (supported: {SUPPORTED})",
    ),
    "lora_a_bias": (
        "base_model.model.model.layers.0.self_attn.q_proj.lora_A.bias",
        "trained bias terms other than lora_B's "
        "(base_model.model.model.layers.0.self_attn.q_proj.lora_A.bias)",
    ),
    "other_tensor": (
        "base_model.model.score.weight",
        f"tensor 'base_model.model.score.weight' (only LoRA factors of {SUPPORTED} can be served)",
    ),
}


def unsupported_contents(folder: Path, labels: str) -> str:
    """The whole refusal naming ``labels``, as a pattern for ``assert_refused``."""
    return f"^{re.escape(f'{folder}: unsupported adapter contents: {labels}')}$"


@pytest.mark.parametrize("case", sorted(UNSUPPORTED_TENSORS))
def test_an_unsupported_tensor_is_named_by_what_it_is(case, registry, tiny_adapters, tiny_base, tmp_path):
    key, label = UNSUPPORTED_TENSORS[case]
    folder = shutil.copytree(tiny_adapters[GOOD], tmp_path / case)
    edit_tensors(folder, add_tensor(key, (8, 64)))
    assert_refused(
        registry, folder, tiny_base, f"^{re.escape(f'{folder}: unsupported adapter contents: {label}')}$"
    )


def test_every_unsupported_tensor_is_named_once_in_order(registry, tiny_adapters, tiny_base, tmp_path):
    folder = shutil.copytree(tiny_adapters[GOOD], tmp_path / "several")
    for key, _ in UNSUPPORTED_TENSORS.values():
        edit_tensors(folder, add_tensor(key, (8, 64)))
    edit_tensors(folder, add_tensor("base_model.model.model.embed_tokens.lora_embedding_B", (64, 8)))
    labels = ", ".join(sorted(label for _, label in UNSUPPORTED_TENSORS.values()))
    assert_refused(
        registry, folder, tiny_base, f"^{re.escape(f'{folder}: unsupported adapter contents: {labels}')}$"
    )


def test_an_adapter_of_fused_projections_is_cut_into_its_parts(tiny_family_models, tmp_path):
    """phi3's qkv_proj B rows become q, k and v (each sharing the fused A), scale folded in."""
    base = tiny_family_models["phi3"]
    spec = next(s for s in FUSED_ADAPTERS if s.targets == ("qkv_proj",))
    folder = build_adapter(base, spec, tmp_path / spec.name)
    model = spec_from_config(json.loads((base / "config.json").read_text()))
    sizes = {part: model.projection_shape(part)[0] for part in ("q_proj", "k_proj", "v_proj")}
    assert len(set(sizes.values())) > 1  # the parts differ in size: a wrong cut shows
    host = load_peft_adapter(spec.name, folder, model.num_layers, model.projection_shape, 16)
    saved = load_file(str(weights(folder)))
    for layer in range(model.num_layers):
        prefix = f"base_model.model.model.layers.{layer}.self_attn.qkv_proj"
        a, b = saved[f"{prefix}.lora_A.weight"], saved[f"{prefix}.lora_B.weight"] * (spec.alpha / spec.rank)
        start = 0
        for part in ("q_proj", "k_proj", "v_proj"):
            part_a, part_b = host.weights[(layer, part)]
            assert torch.equal(part_a, a)
            assert torch.allclose(part_b, b[start : start + sizes[part]], rtol=0, atol=1e-7)
            start += sizes[part]
        assert (layer, "qkv_proj") not in host.weights
    summary = inspect_peft_adapter(folder, model.num_layers, model.projection_shape, 16)
    assert summary.targets == host.targets == ("q_proj", "k_proj", "v_proj")  # the parts, as served


NESTED = "[" * 100_000 + "]" * 100_000  # past the JSON parser's recursion


@pytest.mark.parametrize(
    ("text", "message"),
    [("{", " is not valid JSON: Expecting property name"), (NESTED, ": JSON nested too deeply")],
)
def test_an_unreadable_added_tokens_file_is_named(
    text, message, registry, tiny_adapters, tiny_base, tmp_path
):
    folder = shutil.copytree(tiny_adapters[GOOD], tmp_path / "added")
    (folder / "added_tokens.json").write_text(text)
    assert_refused(registry, folder, tiny_base, f"^{re.escape(str(folder / 'added_tokens.json') + message)}")


def test_added_tokens_outside_the_vocabulary_are_named_the_first_five_in_order(
    registry, tiny_adapters, tiny_base, tmp_path
):
    folder = shutil.copytree(tiny_adapters[GOOD], tmp_path / "added")
    path = folder / "added_tokens.json"
    path.write_text("[1]")
    assert_refused(registry, folder, tiny_base, f"^{re.escape(f'{path} must map token strings to ids')}$")
    added = {f"<t{i}>": 49152 + i for i in range(7)} | {"<0-in-vocabulary>": 3}
    path.write_text(json.dumps(added))
    expected = (
        f"{folder}: adds tokens ('<t0>', '<t1>', '<t2>', '<t3>', '<t4>') outside its vocabulary of 49152; "
        "an adapter that adds tokens must hold its resized embed_tokens and lm_head "
        "(save it with save_embedding_layers=True)"
    )
    assert_refused(registry, folder, tiny_base, f"^{re.escape(expected)}$")


def test_weights_file_names_pickles_and_takes_a_file_of_exactly_its_limit(tmp_path):
    for name in ("training_args.bin", "adapter_model.pt", "notes.txt"):
        (tmp_path / name).write_bytes(b"")
    with pytest.raises(AdapterError) as refused:
        weights_file(tmp_path)
    assert str(refused.value) == (
        f"{tmp_path}: only pickle weights (adapter_model.pt, training_args.bin) found; pickle files can run "
        "code when loaded and are refused. Re-save the adapter with safe_serialization=True"
    )
    path = weights(tmp_path)
    with path.open("wb") as sparse:
        sparse.truncate(MAX_ADAPTER_BYTES)  # 8 GiB that take no disk blocks
    assert weights_file(tmp_path) == path
    with path.open("r+b") as sparse:
        sparse.truncate(MAX_ADAPTER_BYTES + 1)
    with pytest.raises(AdapterError) as refused:
        weights_file(tmp_path)
    assert str(refused.value) == f"{path} is larger than 8 GiB"


def test_factors_stored_in_half_precision_come_in_the_dtype_asked_for(
    tiny_model_dir, tiny_adapters, tmp_path
):
    model = spec_from_config(json.loads((tiny_model_dir / "config.json").read_text()))
    folder = shutil.copytree(tiny_adapters["tiny-r4-qv"], tmp_path / "half")
    edit_tensors(folder, lambda tensors: tensors.update({k: v.half() for k, v in tensors.items()}))
    layers, shape_of = model.num_layers, model.projection_shape
    as_float32 = load_peft_adapter("half", folder, layers, shape_of, 16).weights
    as_float16 = load_peft_adapter("half", folder, layers, shape_of, 16, dtype=torch.float16).weights
    assert as_float32.keys() == as_float16.keys() and len(as_float32) == 2 * layers
    for key, (a32, b32) in as_float32.items():
        a16, b16 = as_float16[key]
        assert (a32.dtype, b32.dtype, a16.dtype, b16.dtype) == (torch.float32,) * 2 + (torch.float16,) * 2
        assert torch.equal(a32, a16.float())  # A is not scaled: the same values


def file_tensors(folder: Path, ending: str) -> dict[tuple[int, str], torch.Tensor]:
    """The file's tensors whose names end in ``ending``, by (layer, module)."""
    found = {}
    for key, tensor in load_file(str(weights(folder))).items():
        if key.endswith(ending) and ".layers." in key:
            parts = key.split(".")
            found[(int(parts[parts.index("layers") + 1]), parts[parts.index("layers") + 3])] = tensor
    return found


@pytest.fixture(scope="module")
def kinds_of_adapters(tiny_adapters, peft_variants, tiny_model_dir, tmp_path_factory) -> dict[str, Path]:
    """Adapters with each kind of content a load returns: plain, DoRA, lora_bias, whole token
    matrices, retrained token rows, and a resized vocabulary with its added tokens."""
    root = tmp_path_factory.mktemp("kinds")
    bias = build_adapter(
        tiny_model_dir,
        AdapterSpec("bias", 4, 8, ("q_proj", "down_proj"), 41, (("lora_bias", True),)),
        root / "bias",
    )
    added = build_adapter(
        tiny_model_dir, AdapterSpec("added", 4, 8, ("q_proj", "v_proj"), 42), root / "added", 8
    )
    (added / "added_tokens.json").write_text(json.dumps({f"<new{i}>": 49152 + i for i in range(8)}))
    return {
        "plain": tiny_adapters[GOOD],
        "dora": peft_variants["dora"],
        "bias": bias,
        "saved_embeddings": peft_variants["saved_embeddings"],
        "trainable_tokens": peft_variants["trainable_tokens"],
        "added": added,
    }


@pytest.mark.parametrize("case", ["plain", "dora", "bias", "saved_embeddings", "trainable_tokens", "added"])
def test_load_and_inspect_return_what_the_files_hold(case, kinds_of_adapters, tiny_base):
    """A load returns lora_B's bias with the config's scale, DoRA's magnitudes as saved, the
    token tables, and its own name and path; inspecting the header alone says the same of rank,
    alpha, targets, size, kind and tokens."""
    folder = kinds_of_adapters[case]
    config = json.loads((folder / "adapter_config.json").read_text())
    scale = config["lora_alpha"] / config["r"]
    layers, shape_of, vocab = tiny_base.num_layers, tiny_base.shape_of, tiny_base.vocab
    host = load_peft_adapter(case, folder, layers, shape_of, 16, vocab)
    assert (host.name, host.path) == (case, folder)
    factors_a = file_tensors(folder, "lora_A.weight")
    assert host.rank == max(a.shape[0] for a in factors_a.values())
    biases = file_tensors(folder, "lora_B.bias")
    assert set(host.biases) == set(biases) and (case == "bias") == bool(biases)
    for key, bias in biases.items():
        torch.testing.assert_close(host.biases[key], bias * scale)
    magnitudes = file_tensors(folder, "lora_magnitude_vector")
    assert set(host.magnitudes) == set(magnitudes) and (case == "dora") == bool(magnitudes)
    for key, magnitude in magnitudes.items():
        assert torch.equal(host.magnitudes[key], magnitude)
    with_tokens = case in ("saved_embeddings", "trainable_tokens", "added")
    assert (host.tokens is not None) == with_tokens
    summary = inspect_peft_adapter(folder, layers, shape_of, 16, vocab)
    assert (summary.rank, summary.alpha, summary.targets, summary.kind) == (
        host.rank,
        config["lora_alpha"],
        host.targets,
        {"dora": "DoRA", "bias": "LoRA with bias"}.get(case, "LoRA"),
    )
    assert summary.size_bytes == weights(folder).stat().st_size
    assert summary.base_model == config["base_model_name_or_path"]
    if host.tokens is None:
        assert (summary.tokens, summary.vocab_size, summary.table_values) == ("", None, 0)
        return
    tables = [t for t in (host.tokens.embed, host.tokens.head) if t is not None]
    expected_vocab = 49152 + 8 if case == "added" else 49152
    assert (summary.tokens, summary.vocab_size) == (host.tokens.label, expected_vocab)
    assert summary.table_values == sum(t.numel() for t in tables) and (case == "trainable_tokens") == (
        not tables
    )


def test_an_adapter_with_token_tensors_needs_the_bases_vocabulary(peft_variants, tiny_base):
    folder = peft_variants["saved_embeddings"]
    with pytest.raises(
        AdapterError, match=r"its embed_tokens / lm_head tensors need the base's vocabulary to check$"
    ):
        load_peft_adapter("tables", folder, tiny_base.num_layers, tiny_base.shape_of, 16)


@pytest.mark.parametrize("case", ["rank_differs_from_config", "r_zero", "trainable_tokens_without_rows"])
def test_inspect_refuses_as_the_import_does_naming_the_folder(case, tiny_adapters, tiny_base, tmp_path):
    mutate, message = CASES[case]
    folder = shutil.copytree(tiny_adapters[GOOD], tmp_path / case)
    mutate(folder)
    with pytest.raises(AdapterError, match=message) as caught:
        inspect_peft_adapter(folder, tiny_base.num_layers, tiny_base.shape_of, 16, tiny_base.vocab)
    assert str(folder) in str(caught.value)


def test_an_alpha_pattern_for_one_layers_module_scales_its_loaded_factors(tiny_adapters, tiny_base, tmp_path):
    folder = shutil.copytree(tiny_adapters[GOOD], tmp_path / "layer-alpha")
    edit_config(folder, lora_alpha=16, alpha_pattern={"model.layers.1.self_attn.q_proj": 32})
    host = load_peft_adapter("layer-alpha", folder, tiny_base.num_layers, tiny_base.shape_of, 16)
    saved_b = file_tensors(folder, "lora_B.weight")
    for (layer, module), (_, b) in host.weights.items():
        scale = 4.0 if (layer, module) == (1, "q_proj") else 2.0  # alpha / r: 32 / 8 there, 16 / 8 elsewhere
        torch.testing.assert_close(b, saved_b[(layer, module)] * scale)


def test_token_tables_stored_in_half_precision_load_in_the_dtype_asked_for(
    peft_variants, tiny_base, tmp_path
):
    folder = shutil.copytree(peft_variants["saved_embeddings"], tmp_path / "half")
    edit_tensors(folder, lambda tensors: tensors.update({k: t.half() for k, t in tensors.items()}))
    layers, shape_of, vocab = tiny_base.num_layers, tiny_base.shape_of, tiny_base.vocab
    for dtype in (torch.float16, torch.float32):
        tokens = load_peft_adapter("half", folder, layers, shape_of, 16, vocab, dtype=dtype).tokens
        assert tokens is not None and tokens.embed is not None and tokens.head is not None
        assert tokens.embed.dtype == tokens.head.dtype == dtype


@pytest.mark.parametrize("option", ["lora_bias", "use_dora"])
def test_a_fused_projections_bias_and_magnitude_are_cut_into_its_parts(option, tiny_family_models, tmp_path):
    """phi3's qkv_proj lora_B bias (scaled) and DoRA magnitude [q + k + v rows] become q's, k's
    and v's rows."""
    base = tiny_family_models["phi3"]
    folder = build_adapter(
        base, AdapterSpec("fused", 4, 8, ("qkv_proj",), 43, ((option, True),)), tmp_path / "f"
    )
    model = spec_from_config(json.loads((base / "config.json").read_text()))
    host = load_peft_adapter("fused", folder, model.num_layers, model.projection_shape, 16)
    ending, got = (
        ("lora_B.bias", host.biases) if option == "lora_bias" else ("lora_magnitude_vector", host.magnitudes)
    )
    scale = 8 / 4 if option == "lora_bias" else 1.0  # a bias is scaled as lora_B's output; a magnitude is not
    for (layer, _), rows in file_tensors(folder, ending).items():
        start = 0
        for part in ("q_proj", "k_proj", "v_proj"):
            size = model.projection_shape(part)[0]
            torch.testing.assert_close(got[(layer, part)], rows[start : start + size] * scale)
            start += size
        assert start == rows.shape[0] and (layer, "qkv_proj") not in got
