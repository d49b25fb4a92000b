"""A Hugging Face model folder (a merged model) written as one GGUF file that llama.cpp, Ollama
and transformers' GGUF loader read: llama.cpp's tensor names (``gguf_names``), its row order for
Llama / Mistral q and k, Gemma's norms stored as 1 + w, the hyperparameters under
``{architecture}.*``, the RoPE scaling (``gguf_rope``) and the tokenizer (``gguf_vocab``).

Weights are F32, F16, BF16 or Q8_0 (vectors stay F32, and a matrix whose rows do not split into
Q8_0's 32-value blocks is F16, as llama.cpp's converter does); other quantizations are
llama.cpp's ``llama-quantize``'s to make from this file.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import torch
from safetensors import safe_open

from multilora_studio.adapters.gguf_adapter import GGUFText, add_text
from multilora_studio.adapters.gguf_names import (
    GGUF_ARCHITECTURES,
    PERMUTED_ROPE,
    gguf_architecture,
    permute_rows,
)
from multilora_studio.checkpoint_files import checkpoint_files
from multilora_studio.engine.model.model_spec import ModelSpec, load_spec
from multilora_studio.merge.gguf_rope import add_rope_scaling
from multilora_studio.merge.gguf_vocab import add_tokenizer
from multilora_studio.merge.merged_weights import MergeError

Q = gguf.GGMLQuantizationType
GGUF_TYPES = {"f32": Q.F32, "f16": Q.F16, "bf16": Q.BF16, "q8_0": Q.Q8_0}
FILE_TYPES = {
    Q.F32: gguf.LlamaFileType.ALL_F32,
    Q.F16: gguf.LlamaFileType.MOSTLY_F16,
    Q.BF16: gguf.LlamaFileType.MOSTLY_BF16,
    Q.Q8_0: gguf.LlamaFileType.MOSTLY_Q8_0,
}
_DECODER_PREFIXES = ("model.language_model.", "language_model.model.")  # gemma3 image-text -> text


def write_gguf_model(folder: Path, out: Path, kind: str, text: GGUFText) -> int:
    """Write the model at ``folder`` as the GGUF file ``out`` with weights of ``kind``
    (``GGUF_TYPES``); return the file's size. MergeError names what GGUF cannot carry here."""
    spec = load_spec(folder)
    architecture = gguf_architecture(spec.model_type)
    writer = gguf.GGUFWriter(str(out), architecture)
    writer.add_type(gguf.GGUFType.MODEL)
    writer.add_file_type(FILE_TYPES[GGUF_TYPES[kind]])
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    add_text(writer, text)
    _add_hyperparameters(writer, spec)
    rope_tensors = add_rope_scaling(writer, spec)
    add_tokenizer(writer, folder, spec.vocab_size)
    name_map = gguf.get_tensor_name_map(GGUF_ARCHITECTURES[spec.model_type], spec.num_layers)
    for name, tensor in _tensors(folder, spec.tie_word_embeddings):
        stem, _, suffix = name.rpartition(".")
        target = name_map.get_name(stem)
        if target is None:
            raise MergeError(f"{folder}: tensor {name} has no GGUF name for {architecture}")
        values = _llama_cpp_layout(spec, name, tensor).to(torch.float32).numpy()
        kind_of = _tensor_type(values, GGUF_TYPES[kind])
        data = values if kind_of == Q.F32 else gguf.quants.quantize(values, kind_of)
        writer.add_tensor(f"{target}.{suffix}", data, raw_dtype=kind_of)
    for name, values in rope_tensors.items():
        writer.add_tensor(name, values, raw_dtype=Q.F32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out.stat().st_size


def _tensors(folder: Path, tied: bool):
    """(Hugging Face name of the decoder's tensor, tensor) for every tensor of the text model; a
    tied matrix once, as the embeddings (some checkpoints store it only as lm_head.weight)."""
    names = {}
    for path in checkpoint_files(folder):
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 (safe_open has no __iter__)
                names[_text_name(name)] = (path, name)
    if tied:
        head = names.pop("lm_head.weight", None)
        if head is not None:
            names.setdefault("model.embed_tokens.weight", head)
    for name_in_text, (path, name) in names.items():
        if not name_in_text.startswith(("model.vision_tower", "model.multi_modal_projector")):
            with safe_open(str(path), framework="pt") as handle:
                yield name_in_text, handle.get_tensor(name)


def _text_name(name: str) -> str:
    for prefix in _DECODER_PREFIXES:
        if name.startswith(prefix):
            return "model." + name[len(prefix) :]
    return name


def _llama_cpp_layout(spec: ModelSpec, name: str, tensor: torch.Tensor) -> torch.Tensor:
    """A tensor as llama.cpp stores it: q/k rows permuted (Llama, Mistral), Gemma's norms as 1 + w."""
    if spec.model_type in PERMUTED_ROPE and ".self_attn.q_proj." in name:
        return permute_rows(tensor, spec.num_heads)
    if spec.model_type in PERMUTED_ROPE and ".self_attn.k_proj." in name:
        return permute_rows(tensor, spec.num_kv_heads)
    if spec.gemma and name.endswith("norm.weight"):
        return tensor.to(torch.float32) + 1
    return tensor


def _tensor_type(values: np.ndarray, wanted: gguf.GGMLQuantizationType) -> gguf.GGMLQuantizationType:
    if values.ndim < 2:
        return Q.F32
    if wanted == Q.Q8_0 and values.shape[-1] % gguf.GGML_QUANT_SIZES[Q.Q8_0][0]:
        return Q.F16
    return wanted


def _add_hyperparameters(writer: gguf.GGUFWriter, spec: ModelSpec) -> None:
    writer.add_context_length(spec.max_position_embeddings)
    writer.add_embedding_length(spec.hidden_size)
    writer.add_feed_forward_length(spec.intermediate_size)
    writer.add_block_count(spec.num_layers)
    writer.add_head_count(spec.num_heads)
    writer.add_head_count_kv(spec.num_kv_heads)
    writer.add_key_length(spec.head_dim)
    writer.add_value_length(spec.head_dim)
    writer.add_rope_dimension_count(spec.head_dim)
    writer.add_rope_freq_base(spec.rope.theta)
    writer.add_layer_norm_rms_eps(spec.rms_norm_eps)
    writer.add_vocab_size(spec.vocab_size)
    windows = [window for window in spec.layer_windows if window is not None]
    if windows:
        writer.add_sliding_window(windows[0])
    if spec.attn_softcap is not None:
        writer.add_attn_logit_softcapping(spec.attn_softcap)
    if spec.final_softcap is not None:
        writer.add_final_logit_softcapping(spec.final_softcap)


def _tokenizer_config(folder: Path) -> dict:
    path = folder / "tokenizer_config.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def chat_template(folder: Path) -> str:
    """The model's Jinja chat template (``chat_template.jinja`` or tokenizer_config.json's), or ""."""
    path = folder / "chat_template.jinja"
    if path.is_file():
        return path.read_text()
    template = _tokenizer_config(folder).get("chat_template")
    return template if isinstance(template, str) else ""
