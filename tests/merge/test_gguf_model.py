"""A merged model written as GGUF: read back through transformers' GGUF loader, its logits equal
the merged folder's within the format's rounding (F32 exactly, F16 / BF16 / Q8_0 by their
precision) and its tokenizer encodes as the folder's (byte-level and SentencePiece-style BPE);
llama3 and longrope RoPE scaling written as llama.cpp's factor tensors."""

from __future__ import annotations

import math
from pathlib import Path

import gguf
import pytest
import torch

from multilora_studio.adapters.gguf_adapter import GGUFText
from multilora_studio.merge import AdapterSource, BaseSource, MergeError, MergeRequest, merge_and_export
from multilora_studio.merge.gguf_model import write_gguf_model
from tests.fixtures import (
    ATTENTION_TARGETS,
    LONGROPE_ROPE,
    MLP_TARGETS,
    AdapterSpec,
    TinyVariant,
    build_adapter,
    build_sentencepiece_tokenizer,
    build_tiny_model,
)

ALL = AdapterSpec("gguf-merge", 8, 16, tuple(ATTENTION_TARGETS + MLP_TARGETS), 51)
PROMPT = [[1, 510, 2300, 44, 901, 77, 12]]
SAMPLE = "Hello world, the quick fox reads ünïcode 🙂<|im_end|>"
# of the logits (these random weights give |logits| up to ~15): float32 exact, the others by
# their precision (8 bits of mantissa for bf16, 8-bit blocks for Q8_0)
TOLERANCE = {"f32": 1e-4, "f16": 1e-1, "bf16": 5e-1, "q8_0": 5e-1}


@pytest.fixture(scope="module")
def merged(tiny_model_dir, tiny_family_models, tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf-merged")
    folders = {}
    for family in ("llama", "qwen2"):
        base = tiny_model_dir if family == "llama" else tiny_family_models[family]
        folders[family] = merged_with_adapter(base, family, root)
    return folders


def merged_with_adapter(base: Path, family: str, root: Path) -> Path:
    adapter = build_adapter(base, ALL, root / f"{family}-adapter")
    source = AdapterSource(ALL.name, str(adapter), "", "0" * 64, 8, ALL.targets, "LoRA")
    request = MergeRequest(base, BaseSource(family, "", "", ""), (adapter,), (source,), root / family)
    return merge_and_export(request).path


def logits_of(folder: Path, gguf_file: str | None = None, prompt=PROMPT, **options) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    if gguf_file:
        options["gguf_file"] = gguf_file
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32, **options).eval()
    with torch.no_grad():
        return model(input_ids=torch.tensor(prompt)).logits[0]


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


def test_sentencepiece_tokenizer_reads_back_with_the_same_ids_and_logits(tmp_path_factory, tmp_path):
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("gguf-sentencepiece")
    tokenizer = build_sentencepiece_tokenizer(root / "tokenizer")
    rows = len(AutoTokenizer.from_pretrained(str(tokenizer))) + 5  # [PADn] rows past the tokenizer's
    base = build_tiny_model(tokenizer, root / "base", variant=TinyVariant("mistral", (("vocab_size", rows),)))
    folder = merged_with_adapter(base, "mistral", root)
    out = tmp_path / "merged.gguf"
    write_gguf_model(folder, out, "f32", GGUFText("merged"))
    fields = gguf.GGUFReader(str(out)).fields
    assert fields["tokenizer.ggml.model"].contents() == "llama"
    assert fields["tokenizer.ggml.add_space_prefix"].contents() is True
    types = fields["tokenizer.ggml.token_type"].contents()
    assert (types[0], types[3], types[-1]) == (
        gguf.TokenType.CONTROL,
        gguf.TokenType.BYTE,
        gguf.TokenType.UNUSED,
    )

    ids = AutoTokenizer.from_pretrained(str(folder)).encode(SAMPLE)
    assert any(3 <= i < 259 for i in ids)  # the sample falls back to bytes somewhere
    assert AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=out.name).encode(SAMPLE) == ids
    expected = logits_of(folder, prompt=[ids])
    torch.testing.assert_close(logits_of(tmp_path, out.name, [ids]), expected, rtol=0, atol=TOLERANCE["f32"])


def test_llama3_rope_is_written_as_llama_cpp_frequency_factors(tiny_family_models, tmp_path):
    from transformers import AutoConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    folder = tiny_family_models["llama3.2-tied"]
    out = tmp_path / "llama3.gguf"
    write_gguf_model(folder, out, "f32", GGUFText("llama3"))
    (factors,) = [t for t in gguf.GGUFReader(str(out)).tensors if t.name == "rope_freqs.weight"]
    config = AutoConfig.from_pretrained(str(folder))
    scaled, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    theta, head_dim = config.rope_parameters["rope_theta"], config.head_dim
    unscaled = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    torch.testing.assert_close(torch.from_numpy(factors.data.copy()), unscaled / scaled)
    assert factors.data.max() > 1.0  # the test config scales some frequencies
    # transformers' GGUF loader reads no rope_freqs (it rotates unscaled): the folder's weights
    # read back, against the folder without scaling
    config.rope_parameters = {"rope_type": "default", "rope_theta": theta}
    expected = logits_of(folder, config=config)
    torch.testing.assert_close(logits_of(tmp_path, out.name), expected, rtol=0, atol=TOLERANCE["f32"])


def test_phi3_longrope_is_written_as_long_and_short_factors(tiny_family_models, tmp_path):
    out = tmp_path / "phi3.gguf"
    write_gguf_model(tiny_family_models["phi3-longrope"], out, "f16", GGUFText("phi3"))
    reader = gguf.GGUFReader(str(out))
    tensors = {t.name: t.data.tolist() for t in reader.tensors if t.name.startswith("rope_factors")}
    assert tensors.keys() == {"rope_factors_long.weight", "rope_factors_short.weight"}
    assert tensors["rope_factors_long.weight"] == pytest.approx(LONGROPE_ROPE["long_factor"])
    assert tensors["rope_factors_short.weight"] == pytest.approx(LONGROPE_ROPE["short_factor"])
    assert reader.fields["phi3.rope.scaling.original_context_length"].contents() == 64
    assert reader.fields["phi3.rope.scaling.attn_factor"].contents() == pytest.approx(
        (1 + math.log(256 / 64) / math.log(64)) ** 0.5
    )


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
