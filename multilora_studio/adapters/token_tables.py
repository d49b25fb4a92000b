"""An adapter's vocabulary side: the embedding and LM-head rows it replaces, read from its
safetensors file and checked against the base before any tensor data is read.

PEFT saves three forms, all served:
- ``modules_to_save`` and a resized vocabulary (added tokens): the whole matrix,
  ``embed_tokens.weight`` / ``lm_head.weight`` [V_a, H] (V_a >= the base's V);
- trainable tokens (``trainable_token_indices``): ``token_adapter.trainable_tokens_delta``
  [k, H], the new rows of the listed token ids (a replacement, not an increment);
- both on a resized vocabulary: ``token_adapter.base_layer.weight`` [V_a, H] and the deltas,
  folded here into one whole matrix.

On a base with tied embeddings, PEFT ties trainable tokens: the embedding's new rows are the
LM head's too; a whole saved module replaces only itself (PEFT leaves the other one tied to
the base's matrix).
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from multilora_studio.adapters.adapter_config import TOKEN_MODULES, AdapterConfig, AdapterError
from multilora_studio.adapters.safetensors_header import FLOAT_DTYPES, TensorEntry
from multilora_studio.adapters.vocab_shape import VocabShape

# decoder path (either naming of an image-text model's), module, form
TOKEN_KEY = re.compile(
    r"^(?:base_model\.model\.)?(?:(?:model|model\.language_model|language_model\.model)\.(?P<embed>embed_tokens)"
    r"|(?:language_model\.)?(?P<head>lm_head))"
    r"(?:\.modules_to_save(?:\.default)?)?"
    r"(?P<form>\.weight|\.token_adapter\.base_layer\.weight|\.token_adapter\.trainable_tokens_delta)"
    r"(?:\.default)?$"
)


@dataclass(frozen=True)
class TokenTablePlan:
    """Which tensors of the file hold the vocabulary side, from the header alone."""

    vocab_size: int  # the adapter's vocabulary: the base's, or more with added tokens
    base_vocab: int
    whole: dict[str, str]  # module -> tensor name of its whole matrix [V_a, H]
    deltas: dict[str, str]  # module -> tensor name of its retrained rows [k, H]
    ids: dict[str, tuple[int, ...]]  # module -> the token ids of those rows

    @property
    def label(self) -> str:
        """What the library shows, e.g. "lm_head", "embed_tokens + lm_head, +8 tokens", "3 tokens"."""
        return label_of(self.whole, self.ids, self.vocab_size, self.base_vocab)


def label_of(
    whole: Collection[str], ids: dict[str, tuple[int, ...]], vocab_size: int, base_vocab: int
) -> str:
    """ "lm_head", "embed_tokens, lm_head, +8 tokens", "3 trained tokens": the modules saved whole,
    the retrained tokens (unless folded into whole matrices) and the tokens added."""
    parts = [module for module in TOKEN_MODULES if module in whole]
    retrained = {i for rows in ids.values() for i in rows}
    if retrained and not all(module in whole for module in ids):
        parts.append(f"{len(retrained)} trained tokens")
    if vocab_size > base_vocab:
        parts.append(f"+{vocab_size - base_vocab} tokens")
    return ", ".join(parts)


@dataclass
class TokenTables:
    """The vocabulary side in host memory: whole matrices and retrained rows per module.

    ``embed`` / ``head``: [V_a, H] whole replacements (None: the base's, with ``*_ids`` rows
    replaced by ``*_rows`` [k, H] if any).
    """

    vocab_size: int
    base_vocab: int
    embed: torch.Tensor | None = None
    head: torch.Tensor | None = None
    embed_ids: torch.Tensor | None = None  # [k] int64
    embed_rows: torch.Tensor | None = None  # [k, H]
    head_ids: torch.Tensor | None = None
    head_rows: torch.Tensor | None = None

    @property
    def nbytes(self) -> int:
        tensors = (self.embed, self.head, self.embed_ids, self.embed_rows, self.head_ids, self.head_rows)
        unique = {id(t): t for t in tensors if t is not None}  # a tied matrix counts once
        return sum(t.nbytes for t in unique.values())

    @property
    def label(self) -> str:
        whole = {m for m, t in (("embed_tokens", self.embed), ("lm_head", self.head)) if t is not None}
        ids = {
            module: tuple(found.tolist())
            for module, found in (("embed_tokens", self.embed_ids), ("lm_head", self.head_ids))
            if found is not None
        }
        return label_of(whole, ids, self.vocab_size, self.base_vocab)

    def to(self, dtype: torch.dtype, pin: bool) -> TokenTables:
        """A copy with the float tables in ``dtype`` (page-locked when ``pin``)."""

        def move(tensor: torch.Tensor | None, floats: bool = True) -> torch.Tensor | None:
            if tensor is None:
                return None
            moved = tensor.to(dtype).contiguous() if floats else tensor
            return moved.pin_memory() if pin else moved

        embed = move(self.embed)
        return TokenTables(
            self.vocab_size,
            self.base_vocab,
            embed,
            embed if self.head is self.embed else move(self.head),
            move(self.embed_ids, floats=False),
            move(self.embed_rows),
            move(self.head_ids, floats=False),
            move(self.head_rows),
        )


def is_token_tensor(key: str) -> bool:
    return TOKEN_KEY.match(key) is not None


def plan_token_tables(
    folder: Path, header: dict[str, TensorEntry], config: AdapterConfig, base: VocabShape | None
) -> TokenTablePlan | None:
    """The vocabulary tensors of ``header`` checked against ``config`` and the base; None if none.

    ``base`` None (a check without the base at hand) skips the shape checks.
    """
    whole: dict[str, str] = {}
    deltas: dict[str, str] = {}
    for key, entry in header.items():
        match = TOKEN_KEY.match(key)
        if match is None:
            continue
        module = match["embed"] or match["head"]
        if entry.dtype not in FLOAT_DTYPES:
            raise AdapterError(f"{folder}: tensor {key!r} has dtype {entry.dtype}; token tables are floats")
        found = deltas if match["form"].endswith("trainable_tokens_delta") else whole
        if module in found:
            raise AdapterError(f"{folder}: two {module} tensors ({found[module]!r} and {key!r})")
        found[module] = key
    if not whole and not deltas:
        declared = [
            f"{key} ({', '.join(modules)})"
            for key, modules in (
                ("modules_to_save", config.modules_to_save),
                ("trainable_token_indices", tuple(config.trainable_tokens)),
            )
            if modules
        ]
        if declared:
            raise AdapterError(
                f"{folder}: adapter_config.json declares {' and '.join(declared)}, but the weights "
                "hold no embed_tokens / lm_head tensor"
            )
        return None
    unsaved = [module for module in config.modules_to_save if module not in whole]
    if unsaved:
        raise AdapterError(f"{folder}: modules_to_save lists {', '.join(unsaved)}, which the weights lack")
    ids = dict(config.trainable_tokens)
    tied = base is None or base.tied
    if (
        tied
        and "embed_tokens" in ids
        and "lm_head" not in ids
        and ("lm_head" in deltas or "lm_head" not in whole)
    ):
        ids["lm_head"] = ids["embed_tokens"]  # PEFT ties the retrained rows into the tied head
    for module, key in deltas.items():
        if module not in ids:
            raise AdapterError(f"{folder}: {key!r} holds trained token rows, but trainable_token_indices "
                               f"in adapter_config.json does not list {module}'s token ids")  # fmt: skip
    missing = sorted(set(ids) - set(deltas) - ({"lm_head"} if "embed_tokens" in deltas else set()))
    if missing:
        raise AdapterError(f"{folder}: trainable_token_indices lists {', '.join(missing)}, whose trained "
                           "rows are not in the weights")  # fmt: skip
    if base is None:
        return TokenTablePlan(0, 0, whole, deltas, ids)
    vocab = _check_shapes(folder, header, whole, deltas, ids, base)
    for module, rows in ids.items():
        too_big = [i for i in rows if i >= vocab]
        if too_big:
            raise AdapterError(f"{folder}: trainable_token_indices of {module} has ids outside the "
                               f"vocabulary of {vocab}: {too_big[:5]}")  # fmt: skip
    if vocab > base.vocab_size:
        for module in TOKEN_MODULES:
            covered = module in whole or (
                base.tied and TOKEN_MODULES[1 - TOKEN_MODULES.index(module)] in whole
            )
            if not covered:
                raise AdapterError(
                    f"{folder}: the adapter's vocabulary has {vocab} tokens (the base's {base.vocab_size}), "
                    f"but it holds no resized {module}; save the adapter with save_embedding_layers=True"
                )
    return TokenTablePlan(vocab, base.vocab_size, whole, deltas, ids)


def _check_shapes(
    folder: Path,
    header: dict[str, TensorEntry],
    whole: dict[str, str],
    deltas: dict[str, str],
    ids: dict[str, tuple[int, ...]],
    base: VocabShape,
) -> int:
    """The adapter's vocabulary size after checking every vocabulary tensor's shape."""
    sizes = set()
    for key in whole.values():
        shape = header[key].shape
        if len(shape) != 2 or shape[1] != base.hidden_size or shape[0] < base.vocab_size:
            raise AdapterError(
                f"{folder}: {key!r} has shape {list(shape)}; the base model needs [V, {base.hidden_size}] "
                f"with V >= its vocabulary of {base.vocab_size}. The adapter was trained on a different base"
            )
        sizes.add(shape[0])
    if len(sizes) > 1:
        raise AdapterError(
            f"{folder}: embed_tokens and lm_head have different vocabularies ({sorted(sizes)})"
        )
    for module, key in deltas.items():
        count = len(ids[module])
        if header[key].shape != (count, base.hidden_size):
            raise AdapterError(
                f"{folder}: {key!r} has shape {list(header[key].shape)}; its {count} trainable tokens need "
                f"[{count}, {base.hidden_size}]"
            )
    return sizes.pop() if sizes else base.vocab_size


def read_token_tables(path: Path, plan: TokenTablePlan, base: VocabShape, dtype: torch.dtype) -> TokenTables:
    """The planned tensors read (in ``dtype`` if stored so, else float32), deltas folded into whole
    matrices where both exist; AdapterError on NaN/Inf or a damaged file."""
    tensors: dict[str, torch.Tensor] = {}
    try:
        with safe_open(str(path), framework="pt") as handle:
            for key in (*plan.whole.values(), *plan.deltas.values()):
                tensor = handle.get_tensor(key)
                tensors[key] = tensor if tensor.dtype == dtype else tensor.to(torch.float32)
    except SafetensorError as error:
        raise AdapterError(f"{path} is corrupt or truncated: {error}") from None
    for key, tensor in tensors.items():
        if not bool(torch.isfinite(tensor).all()):
            raise AdapterError(f"{path}: {key!r} holds NaN or Inf values")
    tables = TokenTables(plan.vocab_size, base.vocab_size)
    for module, attr in (("embed_tokens", "embed"), ("lm_head", "head")):
        matrix = tensors[plan.whole[module]] if module in plan.whole else None
        delta_key = plan.deltas.get(module) or (
            plan.deltas.get("embed_tokens") if module == "lm_head" else None
        )
        ids = torch.tensor(plan.ids[module], dtype=torch.int64) if module in plan.ids else None
        rows = tensors[delta_key] if delta_key is not None and ids is not None else None
        if matrix is not None and rows is not None:
            matrix = matrix.clone().index_copy_(0, ids, rows.to(matrix.dtype))  # type: ignore[arg-type]
            ids = rows = None
        setattr(tables, attr, matrix)
        setattr(tables, f"{attr}_ids", ids)
        setattr(tables, f"{attr}_rows", rows)
    if base.tied and tables.embed is not None and tables.head is None and plan.vocab_size > base.vocab_size:
        tables.head = tables.embed  # a resized, tied vocabulary saved under one name
    if base.tied and tables.head is not None and tables.embed is None and plan.vocab_size > base.vocab_size:
        tables.embed = tables.head
    return tables
