"""A merged model written as GGUF: read back through transformers' GGUF loader, its logits equal
the merged folder's within the format's rounding (F32 exactly, F16 / BF16 / Q8_0 by their
precision)."""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest
import torch

from multilora_studio.adapters.gguf_adapter import GGUFText
from multilora_studio.merge import AdapterSource, BaseSource, MergeError, MergeRequest, merge_and_export
from multilora_studio.merge.gguf_model import write_gguf_model
from tests.fixtures import ATTENTION_TARGETS, MLP_TARGETS, AdapterSpec, build_adapter

ALL = AdapterSpec("gguf-merge", 8, 16, tuple(ATTENTION_TARGETS + MLP_TARGETS), 51)
PROMPT = [[1, 510, 2300, 44, 901, 77, 12]]
# of the logits (these random weights give |logits| up to ~15): float32 exact, the others by
# their precision (8 bits of mantissa for bf16, 8-bit blocks for Q8_0)
TOLERANCE = {"f32": 1e-4, "f16": 1e-1, "bf16": 5e-1, "q8_0": 5e-1}


@pytest.fixture(scope="module")
def merged(tiny_model_dir, tiny_family_models, tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf-merged")
    folders = {}
    for family in ("llama", "qwen2"):
        base = tiny_model_dir if family == "llama" else tiny_family_models[family]
        adapter = build_adapter(base, ALL, root / f"{family}-adapter")
        source = AdapterSource(ALL.name, str(adapter), "", "0" * 64, 8, ALL.targets, "LoRA")
        request = MergeRequest(base, BaseSource(family, "", "", ""), (adapter,), (source,), root / family)
        folders[family] = merge_and_export(request).path
    return folders


def logits_of(folder: Path, gguf_file: str | None = None) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    options = {"gguf_file": gguf_file} if gguf_file else {}
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32, **options).eval()
    with torch.no_grad():
        return model(input_ids=torch.tensor(PROMPT)).logits[0]


@pytest.mark.parametrize(
    ("family", "kind"), [("llama", "f32"), ("llama", "q8_0"), ("qwen2", "f16"), ("qwen2", "bf16")]
)
def test_merged_gguf_reads_back_with_the_merged_logits(family, kind, merged, tmp_path):
    out = tmp_path / "merged.gguf"
    write_gguf_model(merged[family], out, kind, GGUFText("merged", "the card", "tiny"))
    reader = gguf.GGUFReader(str(out))
    assert reader.fields["general.type"].contents() == "model"
    assert reader.fields["general.description"].contents() == "the card"
    assert "tokenizer.chat_template" in reader.fields
    wanted = {"f32": "F32", "f16": "F16", "bf16": "BF16", "q8_0": "Q8_0"}[kind]
    matrices = [t for t in reader.tensors if len(t.shape) == 2]
    assert {t.tensor_type.name for t in matrices} == {wanted}
    expected = logits_of(merged[family])
    read_back = logits_of(tmp_path, out.name)
    torch.testing.assert_close(read_back, expected, rtol=0, atol=TOLERANCE[kind])
    if kind == "f32":
        assert torch.equal(read_back.argmax(-1), expected.argmax(-1))


def test_scaled_rope_beyond_linear_is_refused(tiny_family_models, tmp_path):
    with pytest.raises(MergeError, match="convert_hf_to_gguf"):
        write_gguf_model(tiny_family_models["qwen2-yarn"], tmp_path / "x.gguf", "f16", GGUFText("x"))


def test_export_command_writes_gguf_files_with_their_modelfiles(merged, tiny_model_dir, tmp_path, capsys):
    from multilora_studio.cli import main

    adapter = merged["llama"].parent / "llama-adapter"
    assert (
        main(["export", str(adapter), "--gguf", str(tmp_path / "a.gguf"), "--into-base", str(tiny_model_dir)])
        == 0
    )
    assert "--lora" in capsys.readouterr().out
    text = (tmp_path / "a.Modelfile").read_text()
    assert text.startswith(f"FROM {tiny_model_dir}\nADAPTER ./a.gguf\n")
    assert 'TEMPLATE """' in text and 'PARAMETER stop "<|im_end|>"' in text  # SmolLM2's ChatML
    assert gguf.GGUFReader(str(tmp_path / "a.gguf")).fields["general.type"].contents() == "adapter"
    # the file read back into the library
    assert main(["adapters", "add", str(tmp_path / "a.gguf"), "--model", str(tiny_model_dir)]) == 0
    assert "added 'a'" in capsys.readouterr().out

    assert main(["export", str(adapter), "--gguf", str(tmp_path / "m.gguf"), "--merged", "--type", "q8_0",
                 "--into-base", str(tiny_model_dir)]) == 0  # fmt: skip
    assert "llama-quantize" in capsys.readouterr().out
    assert (tmp_path / "m.Modelfile").read_text().startswith("FROM ./m.gguf\nTEMPLATE")
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "a.Modelfile",
        "a.gguf",
        "m.Modelfile",
        "m.gguf",
    ]
