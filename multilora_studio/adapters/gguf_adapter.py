"""LoRA adapters as llama.cpp's GGUF files: written from an adapter's factors, and read into a
PEFT folder the library imports like any other.

llama.cpp's layout (``convert_lora_to_gguf.py``, checked by ``llama-adapter.cpp``): metadata
``general.type = adapter``, ``adapter.type = lora``, ``adapter.lora.alpha`` and the base's
``general.architecture``; per projection a pair ``blk.N.attn_q.weight.lora_a`` [rank, in] and
``.lora_b`` [out, rank] (numpy's row-major shapes: PEFT's lora_A and lora_B as they are), the
scale ``alpha / rank`` of each pair applied by llama.cpp. The family's own layout (q/k rows,
fused projections) is ``gguf_names``'.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
import torch
from safetensors.torch import save_file

from multilora_studio.adapters.adapter_config import (
    CONFIG_FILE,
    MAX_ADAPTER_BYTES,
    WEIGHTS_FILE,
    AdapterError,
)
from multilora_studio.adapters.base_model import BaseModelRef
from multilora_studio.adapters.gguf_names import (
    FUSED_IN_GGUF,
    PERMUTED_ROPE,
    GGUFFamilyError,
    gguf_architecture,
    gguf_tensor_names,
    hf_module_path,
    permute_rows,
    unpermute_rows,
)
from multilora_studio.adapters.peft_adapter import HostAdapter

FACTOR_SUFFIXES = {".lora_a": "A", ".lora_b": "B"}  # llama.cpp's tensor name suffixes
READ_DTYPES = (  # what llama.cpp's converter writes (--outtype f32, f16, bf16, q8_0)
    gguf.GGMLQuantizationType.F32,
    gguf.GGMLQuantizationType.F16,
    gguf.GGMLQuantizationType.BF16,
    gguf.GGMLQuantizationType.Q8_0,
)


@dataclass(frozen=True)
class GGUFText:
    """What a GGUF file says of itself besides its tensors: ``general.name``, ``general.description``
    (a model card) and the base models it derives from (``general.base_model.N.name`` / ``repo_url``)."""

    name: str
    description: str = ""
    base_name: str = ""
    base_repo_url: str = ""


@dataclass(frozen=True)
class ReadGGUFAdapter:
    """An adapter read from a GGUF file into a PEFT folder."""

    folder: Path
    text: GGUFText
    architecture: str
    alpha: float
    rank: int
    tensors: int


def add_text(writer: gguf.GGUFWriter, text: GGUFText) -> None:
    """``text`` as the file's general.* metadata."""
    writer.add_name(text.name)
    if text.description:
        writer.add_description(text.description)
    if text.base_name or text.base_repo_url:
        writer.add_base_model_count(1)
        writer.add_base_model_name(0, text.base_name or text.base_repo_url)
        if text.base_repo_url:
            writer.add_base_model_repo_url(0, text.base_repo_url)


def write_gguf_adapter(adapter: HostAdapter, base: BaseModelRef, out: Path, text: GGUFText) -> int:
    """Write ``adapter`` (validated against ``base``) as a llama.cpp LoRA adapter at ``out``, in
    float32; return the number of tensor pairs. AdapterError for what llama.cpp's LoRA cannot
    hold (biases, DoRA, embedding or LM-head rows)."""
    extras = [
        label
        for label, present in (
            ("lora_bias", adapter.biases),
            ("DoRA magnitudes", adapter.magnitudes),
            ("embedding / LM-head rows", adapter.tokens is not None),
        )
        if present
    ]
    if extras:
        raise AdapterError(f"{adapter.name}: a llama.cpp LoRA adapter cannot hold its {', '.join(extras)}")
    architecture = gguf_architecture(base.model_type)
    alpha = adapter.alpha if adapter.alpha > 0 else float(adapter.rank)
    writer = gguf.GGUFWriter(str(out), architecture)
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, alpha)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    add_text(writer, text)
    pairs = 0
    for (layer, module), name in gguf_tensor_names(base.model_type, base.num_layers).items():
        factors = _gguf_factors(adapter, base, layer, module)
        if factors is None:
            continue
        a, b = factors  # a: [rank, in], b: [out, rank], scale folded in
        b = b * (a.shape[0] / alpha)  # llama.cpp multiplies by alpha / rank
        writer.add_tensor(name + ".lora_a", a.to(torch.float32).numpy())
        writer.add_tensor(name + ".lora_b", b.to(torch.float32).numpy())
        pairs += 1
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return pairs


def _gguf_factors(
    adapter: HostAdapter, base: BaseModelRef, layer: int, module: str
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The (A, B scaled) of one GGUF tensor: a projection's, or the parts of a fused one joined
    (their shared A, or A stacked and B block-diagonal); None when the adapter has none."""
    parts = FUSED_IN_GGUF.get(base.model_type, {}).get(module, (module,))
    found = {part: adapter.weights.get((layer, part)) for part in parts}
    present = [(part, ab) for part, ab in found.items() if ab is not None]
    if not present:
        return None
    if len(parts) == 1:
        a, b = present[0][1]
    elif len(present) == len(parts) and all(torch.equal(ab[0], present[0][1][0]) for _, ab in present):
        a, b = present[0][1][0], torch.cat([ab[1] for _, ab in present])
    else:
        a = torch.cat([ab[0] for _, ab in present])  # [sum of ranks, in]
        b = torch.zeros(sum(base.shape_of(part)[0] for part in parts), a.shape[0])  # [out, sum of ranks]
        row = col = 0
        for part in parts:
            rows = base.shape_of(part)[0]
            if found[part] is not None:
                part_b = found[part][1]  # type: ignore[index]
                b[row : row + rows, col : col + part_b.shape[1]] = part_b
                col += part_b.shape[1]
            row += rows
    if base.model_type in PERMUTED_ROPE and module in ("q_proj", "k_proj"):
        b = permute_rows(b, base.num_heads if module == "q_proj" else base.num_kv_heads)
    return a, b


def read_gguf_adapter(path: Path, base: BaseModelRef, target: Path) -> ReadGGUFAdapter:
    """Check a llama.cpp LoRA adapter file against ``base`` and write it as a PEFT folder at
    ``target`` (float32); AdapterError names what does not fit."""
    path = Path(path)
    if not path.is_file():
        raise AdapterError(f"{path} is not a file")
    if path.stat().st_size > MAX_ADAPTER_BYTES:
        raise AdapterError(f"{path} is larger than an adapter can be ({MAX_ADAPTER_BYTES >> 30} GiB)")
    try:
        reader = gguf.GGUFReader(str(path))
    except (ValueError, OSError) as error:
        raise AdapterError(f"{path} is not a GGUF file: {error}") from None
    fields = {key: _value(field) for key, field in reader.fields.items()}
    kind = fields.get(gguf.Keys.General.TYPE, "model")
    if kind != gguf.GGUFType.ADAPTER:
        raise AdapterError(
            f"{path} is a GGUF {kind} ({len(reader.tensors)} tensors), not a LoRA adapter: "
            "GGUF adapters carry general.type = adapter"
        )
    if fields.get(gguf.Keys.Adapter.TYPE) != "lora":
        raise AdapterError(
            f"{path}: adapter.type is {fields.get(gguf.Keys.Adapter.TYPE)!r}; only lora is supported"
        )
    alpha = fields.get(gguf.Keys.Adapter.LORA_ALPHA)
    if not isinstance(alpha, float) or not np.isfinite(alpha) or alpha <= 0:
        raise AdapterError(f"{path} has no positive {gguf.Keys.Adapter.LORA_ALPHA}: its scale is unknown")
    architecture = fields.get(gguf.Keys.General.ARCHITECTURE, "")
    try:
        expected = gguf_architecture(base.model_type)
    except GGUFFamilyError as error:
        raise AdapterError(f"{path}: the base {base.name}: {error}") from None
    if architecture != expected:
        raise AdapterError(
            f"{path} is an adapter of a {architecture!r} model; the base {base.name} is {expected!r} "
            f"({base.model_type})"
        )
    factors = _read_factors(path, reader, base)
    tensors: dict[str, torch.Tensor] = {}
    ranks: dict[str, int] = {}
    for (layer, module), pair in sorted(factors.items()):
        a, b = pair["A"], pair["B"]
        if base.model_type in PERMUTED_ROPE and module in ("q_proj", "k_proj"):
            b = unpermute_rows(b, base.num_heads if module == "q_proj" else base.num_kv_heads)
        key = f"base_model.model.{hf_module_path(layer, module)}"
        tensors[f"{key}.lora_A.weight"] = a.contiguous()
        tensors[f"{key}.lora_B.weight"] = b.contiguous()
        ranks[hf_module_path(layer, module)] = a.shape[0]
    rank = Counter(ranks.values()).most_common(1)[0][0]
    text = GGUFText(
        name=str(fields.get(gguf.Keys.General.NAME) or path.stem),
        description=str(fields.get(gguf.Keys.General.DESCRIPTION) or ""),
        base_name=str(fields.get(gguf.Keys.General.BASE_MODEL_NAME.format(id=0)) or ""),
        base_repo_url=str(fields.get(gguf.Keys.General.BASE_MODEL_REPO_URL.format(id=0)) or ""),
    )
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": rank,
        "lora_alpha": alpha,
        "rank_pattern": {module: r for module, r in ranks.items() if r != rank},
        "target_modules": sorted({module for _, module in factors}),
        "base_model_name_or_path": text.base_name or None,
        "bias": "none",
    }
    target.mkdir(parents=True)
    (target / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    save_file(tensors, str(target / WEIGHTS_FILE), metadata={"format": "pt", "source": path.name})
    return ReadGGUFAdapter(target, text, architecture, alpha, rank, len(factors))


def _read_factors(path: Path, reader: gguf.GGUFReader, base: BaseModelRef) -> dict[tuple[int, str], dict]:
    """``{(layer, projection): {"A": [rank, in], "B": [out, rank]}}`` in float32, names and
    shapes checked against the base."""
    places = {name: place for place, name in gguf_tensor_names(base.model_type, base.num_layers).items()}
    factors: dict[tuple[int, str], dict] = {}
    unknown = []
    for tensor in reader.tensors:
        stem, suffix = tensor.name.rsplit(".", 1) if "." in tensor.name else (tensor.name, "")
        which = FACTOR_SUFFIXES.get("." + suffix)
        place = places.get(stem)
        if which is None or place is None:
            unknown.append(tensor.name)
            continue
        if tensor.tensor_type not in READ_DTYPES:
            raise AdapterError(
                f"{path}: {tensor.name} is stored as {tensor.tensor_type.name}; read are F32, F16, BF16, Q8_0"
            )
        shape = tuple(int(n) for n in reversed(tensor.shape))  # numpy's row-major shape
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type).reshape(shape)
        factors.setdefault(place, {})[which] = torch.from_numpy(np.array(values, dtype=np.float32))
    if unknown:
        listed = ", ".join(unknown[:5]) + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else "")
        raise AdapterError(
            f"{path}: tensors that are not LoRA factors of a {base.model_type} projection the engine "
            f"serves: {listed}"
        )
    if not factors:
        raise AdapterError(f"{path} holds no LoRA tensors")
    for (layer, module), pair in factors.items():
        if set(pair) != {"A", "B"}:
            raise AdapterError(
                f"{path}: layer {layer} {module} has lora_{'b' if 'A' in pair else 'a'} missing"
            )
        out, inputs = base.shape_of(module)
        a, b = pair["A"], pair["B"]
        if (
            a.ndim != 2
            or b.ndim != 2
            or a.shape[1] != inputs
            or b.shape[0] != out
            or a.shape[0] != b.shape[1]
        ):
            raise AdapterError(
                f"{path}: layer {layer} {module}: lora_a {list(a.shape)} and lora_b {list(b.shape)} do "
                f"not fit the base {base.name}'s [{out}, {inputs}] projection (lora_a [rank, {inputs}], "
                f"lora_b [{out}, rank])"
            )
    return factors


def _value(field: gguf.ReaderField) -> object:
    """A metadata value as Python (a float32 as a float, a string as str)."""
    value = field.contents()
    return float(value) if isinstance(value, (np.floating, float)) else value
