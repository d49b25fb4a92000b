"""LoRA adapters as llama.cpp's GGUF files: the tensors, shapes and alpha llama.cpp expects for
each family, the delta it computes equal to PEFT's, and a file read back into the library
serving the same tokens as the original, in one mixed batch (float32)."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from multilora_studio.adapters.adapter_config import AdapterError
from multilora_studio.adapters.base_model import BaseModelRef
from multilora_studio.adapters.gguf_adapter import GGUFText, read_gguf_adapter, write_gguf_adapter
from multilora_studio.adapters.gguf_import import import_gguf_adapter
from multilora_studio.adapters.peft_adapter import load_peft_adapter
from multilora_studio.adapters.registry import Registry
from multilora_studio.engine import Engine, EngineConfig, SamplingParams
from multilora_studio.engine.model.model_spec import load_spec
from tests.fixtures import ATTENTION_TARGETS, MLP_TARGETS, AdapterSpec, build_adapter

ALL = AdapterSpec("gguf-all", 8, 16, tuple(ATTENTION_TARGETS + MLP_TARGETS), 41)
QK_DOWN = AdapterSpec("gguf-qk-down", 4, 12, ("q_proj", "k_proj", "down_proj"), 42)
FUSED = AdapterSpec("gguf-fused", 8, 16, ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"), 43)
# llama.cpp's tensor names (gguf-py's constants.py TENSOR_NAMES, as convert_hf_to_gguf maps
# each family) and its general.architecture, written out here as a reader of llama.cpp knows them
LLAMA_CPP_NAMES = {
    "q_proj": "attn_q",
    "k_proj": "attn_k",
    "v_proj": "attn_v",
    "o_proj": "attn_output",
    "gate_proj": "ffn_gate",
    "up_proj": "ffn_up",
    "down_proj": "ffn_down",
    "qkv_proj": "attn_qkv",
    "gate_up_proj": "ffn_up",
}
FAMILIES = {  # tiny model -> (general.architecture, q/k rows permuted, adapter)
    "llama": ("llama", True, ALL),
    "mistral": ("llama", True, QK_DOWN),
    "qwen2": ("qwen2", False, ALL),
    "qwen3": ("qwen3", False, QK_DOWN),
    "phi3": ("phi3", False, FUSED),
    "gemma2": ("gemma2", False, ALL),
    "gemma3": ("gemma3", False, QK_DOWN),
}
PROMPTS = [[1, 510, 2300, 44, 901], [1, 40000, 12, 7], [1, 88, 9, 1200]]


def model_of(family: str, tiny_model_dir: Path, tiny_family_models) -> Path:
    return tiny_model_dir if family == "llama" else tiny_family_models[family]


def unpermute(rows: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's q/k row order back to Hugging Face's (as transformers' GGUF loader undoes it)."""
    return (
        rows.reshape(heads, rows.shape[0] // heads // 2, 2, *rows.shape[1:])
        .swapaxes(1, 2)
        .reshape(rows.shape)
    )


@pytest.fixture(scope="module")
def exported(tiny_model_dir, tiny_family_models, tmp_path_factory):
    """family -> (base folder, adapter folder, GGUF file, base ref)."""
    root = tmp_path_factory.mktemp("gguf-adapters")
    made = {}
    for family, (_, _, spec) in FAMILIES.items():
        base = model_of(family, tiny_model_dir, tiny_family_models)
        adapter = build_adapter(base, spec, root / f"{family}-adapter")
        model = load_spec(base)
        ref = BaseModelRef.of_spec(family, "", model)
        host = load_peft_adapter(
            spec.name, adapter, model.num_layers, model.projection_shape, 64, model.vocab
        )
        out = root / f"{family}.gguf"
        write_gguf_adapter(host, ref, out, GGUFText(spec.name, "a card", "tiny", "https://example.org/tiny"))
        made[family] = (base, adapter, out, ref)
    return made


@pytest.mark.parametrize("family", FAMILIES)
def test_exported_adapter_has_llama_cpp_layout(family, exported):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base, adapter, out, ref = exported[family]
    architecture, permuted, spec = FAMILIES[family]
    reader = gguf.GGUFReader(str(out))
    fields = {key: field.contents() for key, field in reader.fields.items()}
    assert fields["general.type"] == "adapter"
    assert fields["adapter.type"] == "lora"
    assert fields["general.architecture"] == architecture
    assert fields["adapter.lora.alpha"] == pytest.approx(spec.alpha)
    assert fields["general.name"] == spec.name and fields["general.base_model.0.repo_url"].endswith("tiny")

    # PEFT's own delta of every targeted weight: the reference
    model = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32), str(adapter)
    )
    deltas = {}
    for name, module in model.named_modules():
        if hasattr(module, "get_delta_weight") and "default" in getattr(module, "lora_A", {}):
            layer = int(name.split(".layers.")[1].split(".")[0])
            deltas[(layer, name.rsplit(".", 1)[1])] = module.get_delta_weight("default").numpy()
    tensors = {tensor.name: tensor for tensor in reader.tensors}
    expected = {
        f"blk.{layer}.{LLAMA_CPP_NAMES[module]}.weight.lora_{part}"
        for layer, module in deltas
        for part in "ab"
    }
    assert set(tensors) == expected
    alpha = float(fields["adapter.lora.alpha"])
    for (layer, module), delta in deltas.items():
        stem = f"blk.{layer}.{LLAMA_CPP_NAMES[module]}.weight"
        a, b = tensors[stem + ".lora_a"], tensors[stem + ".lora_b"]
        out_features, in_features = delta.shape
        rank = int(a.shape[1])
        # ggml's ne order: lora_a [in, rank], lora_b [rank, out] (llama-adapter.cpp's shape check)
        assert [int(n) for n in a.shape] == [in_features, rank]
        assert [int(n) for n in b.shape] == [rank, out_features]
        assert a.tensor_type == b.tensor_type == gguf.GGMLQuantizationType.F32
        applied = (alpha / rank) * (np.asarray(b.data) @ np.asarray(a.data))  # what llama.cpp adds
        if permuted and module in ("q_proj", "k_proj"):
            applied = unpermute(applied, ref.num_heads if module == "q_proj" else ref.num_kv_heads)
        np.testing.assert_allclose(applied, delta, rtol=1e-5, atol=1e-6, err_msg=f"{layer} {module}")


@pytest.mark.parametrize("family", ["llama", "qwen3", "phi3", "gemma2"])
def test_export_then_import_serves_the_same_tokens(family, exported, tmp_path):
    base, adapter, out, ref = exported[family]
    record = import_gguf_adapter(Registry(tmp_path / "library"), out, ref, name=f"{family}-from-gguf")
    assert record.source == str(out) and "converted from GGUF" in record.notes
    greedy = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    settings = dict(device="cpu", dtype="float32", max_model_len=64, max_lora_rank=16)
    with Engine(EngineConfig(model=str(base), **settings)) as engine:
        engine.add_adapter("original", adapter)
        engine.add_adapter("imported", record.path)
        names = ["original", "imported", None] * len(PROMPTS)
        prompts = [prompt for prompt in PROMPTS for _ in range(3)]
        outputs = [o.token_ids for o in engine.generate(prompts, names, greedy)]
    for row in range(0, len(outputs), 3):
        assert outputs[row] == outputs[row + 1]
    assert any(outputs[row] != outputs[row + 2] for row in range(0, len(outputs), 3))  # the adapter matters


def test_gguf_files_that_are_not_adapters_of_the_base_are_refused(exported, default_model, tmp_path):
    _, _, llama_file, llama = exported["llama"]
    _, _, qwen_file, _ = exported["qwen2"]
    with pytest.raises(AdapterError, match=r"adapter of a 'qwen2' model; the base llama is 'llama'"):
        read_gguf_adapter(qwen_file, llama, tmp_path / "a")
    from multilora_studio.default_model import gguf_path

    with pytest.raises(AdapterError, match=r"is a GGUF model .* not a LoRA adapter"):
        read_gguf_adapter(gguf_path(), llama, tmp_path / "b")

    def rewrite(name: str, keep_alpha: bool = True, extra: str | None = None) -> Path:
        reader = gguf.GGUFReader(str(llama_file))
        writer = gguf.GGUFWriter(str(tmp_path / name), "llama")
        writer.add_type("adapter")
        writer.add_string("adapter.type", "lora")
        if keep_alpha:
            writer.add_float32("adapter.lora.alpha", 16.0)
        for tensor in reader.tensors:
            writer.add_tensor(tensor.name, np.asarray(tensor.data))
        if extra:
            writer.add_tensor(extra, np.ones((4, 64), dtype=np.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        return tmp_path / name

    with pytest.raises(AdapterError, match=r"no positive adapter\.lora\.alpha"):
        read_gguf_adapter(rewrite("no-alpha.gguf", keep_alpha=False), llama, tmp_path / "c")
    with pytest.raises(AdapterError, match=r"not LoRA factors .*: token_embd\.weight\.lora_a"):
        read_gguf_adapter(rewrite("embd.gguf", extra="token_embd.weight.lora_a"), llama, tmp_path / "d")
    narrow = BaseModelRef(**{**vars(llama), "shapes": {**llama.shapes, "down_proj": (64, 128)}})
    with pytest.raises(AdapterError, match=r"do not fit the base llama.s \[64, 128\] projection"):
        read_gguf_adapter(llama_file, narrow, tmp_path / "e")
