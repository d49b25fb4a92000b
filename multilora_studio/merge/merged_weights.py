"""The base checkpoint with one adapter merged in, one tensor at a time, in float32.

For every projection the adapter trains, ``W' = W + B A`` (B with the LoRA scale folded in,
``HostAdapter``); with DoRA, ``W' = (m / ||W + B A||) * (W + B A)`` per output row, as PEFT
merges it; with ``lora_bias``, the base's bias of that projection gets B's bias (a projection
without a bias of its own is refused: the architecture has no place for one). The vocabulary
side (``TokenTables``: modules_to_save, trained or added tokens) replaces embedding and
LM-head rows; a tied base whose two sides now differ is written untied. Every value is
computed in float32 and cast once to the output dtype.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from multilora_studio.adapters.adapter_config import FUSED_TARGETS, PROJECTION_TARGETS
from multilora_studio.adapters.peft_adapter import HostAdapter
from multilora_studio.adapters.safetensors_header import TensorEntry, data_offset, read_header
from multilora_studio.adapters.token_tables import TokenTables
from multilora_studio.checkpoint_files import checkpoint_files
from multilora_studio.engine.model.model_spec import ModelSpec
from multilora_studio.engine.model.weights import decoder_prefix
from multilora_studio.merge.shard_writer import SAFETENSORS_DTYPES, PlannedTensor

_DTYPE_OF = {name: dtype for dtype, name in SAFETENSORS_DTYPES.items()}
_LAYER_TENSOR = r"\.layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.(weight|bias)$"


class MergeError(ValueError):
    """A merge that cannot be done as asked; the message says why."""


@dataclass(frozen=True)
class _Target:
    """A base tensor the adapter changes: a projection's weight or bias (its parts in row order)."""

    layer: int
    parts: tuple[str, ...]
    param: str  # "weight" | "bias"


class MergedWeights:
    """The merged checkpoint's tensors: ``plan()`` names them, ``value()`` computes one.

    ``config_changes``: the config.json fields the merge changes (``vocab_size``,
    ``tie_word_embeddings``).
    """

    def __init__(
        self, base_folder: Path, spec: ModelSpec, adapter: HostAdapter | None, dtype: torch.dtype
    ) -> None:
        declared = json.loads((Path(base_folder) / "config.json").read_text()).get("quantization_config")
        if declared:  # its tensors are packed integers or FP8 values with scales, not float weights
            raise MergeError(
                f"{base_folder} is a quantized checkpoint ({declared.get('quant_method')}); merge the "
                "adapter into the float base it was quantized from"
            )
        self._spec = spec
        self._adapter = adapter
        self._dtype = dtype
        # name -> (file, where its data begins, its header entry): tensors are read with plain
        # file reads, not a memory map, so what was read leaves the process once merged
        self._where: dict[str, tuple[Path, int, TensorEntry]] = {}
        for path in checkpoint_files(Path(base_folder)):
            start = data_offset(path)
            self._where |= {name: (path, start, entry) for name, entry in read_header(path).items()}
        decoder, head_prefix = decoder_prefix(self._where.__contains__)
        self._embed_name = f"{decoder}.embed_tokens.weight"
        self._head_name = f"{head_prefix}lm_head.weight"
        self._targets = self._find_targets(decoder)
        self._check_adapter_fits()
        self._tokens = adapter.tokens if adapter is not None else None
        self._untie = spec.tie_word_embeddings and self._tokens is not None and not _same_sides(self._tokens)
        self.config_changes: dict[str, object] = {}
        if self._tokens is not None and self._tokens.vocab_size != spec.vocab_size:
            self.config_changes["vocab_size"] = self._tokens.vocab_size
        if self._untie:
            self.config_changes["tie_word_embeddings"] = False

    def plan(self) -> list[PlannedTensor]:
        """Every tensor of the merged checkpoint, in name order (float tensors in the output dtype)."""
        names = set(self._where)
        if self._untie:
            names |= {self._embed_name, self._head_name}
        planned = []
        for name in sorted(names):
            shape, dtype = self._source_shape(name)
            if name in (self._embed_name, self._head_name) and self._tokens is not None:
                shape = (self._tokens.vocab_size, *shape[1:])
            planned.append(PlannedTensor(name, shape, self._dtype if dtype.is_floating_point else dtype))
        return planned

    def value(self, planned: PlannedTensor) -> torch.Tensor:
        """One merged tensor, as planned."""
        name = planned.name
        if name in (self._embed_name, self._head_name) and self._tokens is not None:
            merged = self._vocabulary_side(name, self._tokens)
        else:
            tensor = self._read(name)
            if not tensor.dtype.is_floating_point:
                return tensor
            merged = self._merge_projection(self._targets[name], tensor) if name in self._targets else tensor
        return merged.to(self._dtype)

    # -------------------------------------------------------------------------------- planning

    def _find_targets(self, decoder: str) -> dict[str, _Target]:
        pattern = re.compile("^" + re.escape(decoder) + _LAYER_TENSOR)
        targets = {}
        for name in self._where:
            found = pattern.match(name)
            if found is None:
                continue
            module = found.group(2)
            parts = FUSED_TARGETS.get(module) or ((module,) if module in PROJECTION_TARGETS else None)
            if parts is not None:
                targets[name] = _Target(int(found.group(1)), parts, found.group(3))
        return targets

    def _check_adapter_fits(self) -> None:
        if self._adapter is None:
            return
        if self._adapter.invocation_tokens:
            raise MergeError(
                f"{self._adapter.name}: it is an activated LoRA (alora_invocation_tokens), which "
                "applies only from its invocation on; merged into the weights it would apply "
                "everywhere (PEFT refuses to merge it too); serve it as an adapter instead"
            )
        weights = {(t.layer, part) for t in self._targets.values() if t.param == "weight" for part in t.parts}
        biases = {(t.layer, part) for t in self._targets.values() if t.param == "bias" for part in t.parts}
        missing = sorted(set(self._adapter.weights) - weights)
        if missing:
            layer, module = missing[0]
            raise MergeError(
                f"{self._adapter.name}: the base checkpoint has no layer {layer} {module} weight "
                f"({len(missing)} trained projections missing); is this the adapter's base?"
            )
        no_bias = sorted(set(self._adapter.biases) - biases)
        if no_bias:
            layer, module = no_bias[0]
            raise MergeError(
                f"{self._adapter.name}: it trains a bias (lora_bias) on layer {layer} {module}, "
                f"which has no bias in this base's architecture, so a merged model has no place "
                f"for it; serve it as an adapter instead"
            )

    def _source_shape(self, name: str) -> tuple[tuple[int, ...], torch.dtype]:
        entry = self._where[self._stored_name(name)][2]
        if entry.dtype not in _DTYPE_OF:
            raise MergeError(f"base tensor {name} has dtype {entry.dtype}, which a merge does not read")
        return entry.shape, _DTYPE_OF[entry.dtype]

    def _stored_name(self, name: str) -> str:
        """The base tensor ``name`` is read from: itself, or for an untied side of a tied base
        that stores one name, the other side's matrix."""
        if name in self._where:
            return name
        return self._embed_name if name == self._head_name else self._head_name

    # ------------------------------------------------------------------------------- computing

    def _read(self, name: str) -> torch.Tensor:
        path, start, entry = self._where[name]
        shape, dtype = self._source_shape(name)
        data = bytearray(entry.nbytes)
        with path.open("rb") as handle:
            handle.seek(start + entry.begin)
            if handle.readinto(data) != entry.nbytes:
                raise MergeError(f"{path} is truncated at tensor {name}")
        if not data:
            return torch.empty(shape, dtype=dtype)
        return torch.frombuffer(data, dtype=dtype).reshape(shape)

    def _merge_projection(self, target: _Target, tensor: torch.Tensor) -> torch.Tensor:
        adapter = self._adapter
        merged = tensor.to(torch.float32, copy=True)  # [out_total, in] or [out_total]
        if adapter is None:
            return merged
        row = 0
        for part in target.parts:
            rows = self._spec.projection_shape(part)[0]
            key = (target.layer, part)
            view = merged[row : row + rows]
            if target.param == "weight" and key in adapter.weights:
                a, b_scaled = adapter.weights[key]  # [r, in], [out, r]
                view += b_scaled.float() @ a.float()
                if key in adapter.magnitudes:  # DoRA: rescale each row to its magnitude
                    norms = view.norm(dim=1)  # [out]
                    view *= (adapter.magnitudes[key].float() / norms)[:, None]
            elif target.param == "bias" and key in adapter.biases:
                view += adapter.biases[key].float()
            row += rows
        return merged

    def _vocabulary_side(self, name: str, tables: TokenTables) -> torch.Tensor:
        is_embed = name == self._embed_name
        whole, ids, rows = (
            (tables.embed, tables.embed_ids, tables.embed_rows)
            if is_embed
            else (tables.head, tables.head_ids, tables.head_rows)
        )
        if whole is not None:
            matrix = whole.float().clone()  # [V_a, H]
        else:
            matrix = self._read(self._stored_name(name)).float()  # [V, H]
            if matrix.shape[0] != tables.vocab_size:
                raise MergeError(
                    f"the adapter's vocabulary has {tables.vocab_size} tokens but it brings no "
                    f"{'embed_tokens' if is_embed else 'lm_head'} matrix of that size"
                )
        if ids is not None and rows is not None:
            matrix.index_copy_(0, ids, rows.float())
        return matrix


def _same_sides(tables: TokenTables) -> bool:
    """Whether the embedding and the LM head stay one matrix (what a tied base needs)."""

    def same(x: torch.Tensor | None, y: torch.Tensor | None) -> bool:
        return x is y or (x is not None and y is not None and x.shape == y.shape and torch.equal(x, y))

    return (
        same(tables.embed, tables.head)
        and same(tables.embed_ids, tables.head_ids)
        and same(tables.embed_rows, tables.head_rows)
    )
