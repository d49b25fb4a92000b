"""A model folder's tokenizer as GGUF ``tokenizer.ggml.*`` metadata, as llama.cpp's
convert_hf_to_gguf.py writes it, read from ``tokenizer.json``:

- byte-level BPE (Llama 3, Qwen, SmolLM): model ``gpt2``, its merges and a pre-tokenizer name;
- SentencePiece-style BPE, a BPE with ``byte_fallback`` (Llama 2, Mistral v0.1-v0.3, Phi-3,
  Gemma 2/3): model ``llama`` with a score per token, byte tokens ``<0xNN>`` typed BYTE, added
  tokens CONTROL (special) or USER_DEFINED (their ``▁`` written as spaces) and whether a space is
  put before the text (``add_space_prefix``). The scores order the merges: llama.cpp merges the
  pair whose result scores highest, so a token scores minus the rank of the first merge that
  makes it (tokens no merge makes score below all of them).

Special token ids, add_bos / add_eos and the chat template come from gguf's SpecialVocab. Other
tokenizers (Unigram, WordPiece) raise MergeError.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import gguf

from multilora_studio.merge.merged_weights import MergeError

T = gguf.TokenType
SPACE = "\u2581"  # SentencePiece's visible space
# llama.cpp's name of a byte-level BPE pre-tokenizer, by what tokenizer.json's pre_tokenizer
# holds (a regex, or SmolLM's single digits); "default" for others
PRE_TOKENIZERS = (
    ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}", "llama-bpe"),
    ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}|", "qwen2"),
    ('"individual_digits": true', "smollm"),
)
# added tokens llama.cpp types CONTROL though a checkpoint does not mark them special
_LOOK_SPECIAL = re.compile(r"<\|.*\|>|<｜.*｜>|<unused.*>|<pad>|<mask>|<2mass>|\[@BOS@\]", re.DOTALL)
_BYTE = re.compile(r"<0x[0-9A-Fa-f]{2}>")


def add_tokenizer(writer: gguf.GGUFWriter, folder: Path, vocab_size: int) -> None:
    """The tokenizer of ``folder/tokenizer.json`` padded to ``vocab_size`` rows (``[PADn]``,
    UNUSED), its special tokens and chat template."""
    path = folder / "tokenizer.json"
    if not path.is_file():
        raise MergeError(f"{folder} has no tokenizer.json; a GGUF model carries its tokenizer")
    data = json.loads(path.read_text())
    model = data.get("model", {})
    pre_tokenizer = json.dumps(data.get("pre_tokenizer"))
    if model.get("type") == "BPE" and model.get("byte_fallback"):
        _add_sentencepiece_bpe(writer, data, vocab_size)
    elif model.get("type") == "BPE" and "ByteLevel" in pre_tokenizer:
        _add_byte_level_bpe(writer, data, vocab_size)
    else:
        raise MergeError(
            "the merged GGUF is written for BPE tokenizers (byte-level: Llama 3, Qwen, SmolLM; with byte "
            "fallback: Llama 2, Mistral, Phi-3, Gemma); for this tokenizer, convert the merged folder with "
            "llama.cpp's convert_hf_to_gguf.py"
        )
    gguf.SpecialVocab(folder, load_merges=False, n_vocab=vocab_size).add_to_gguf(writer, quiet=True)


def _add_byte_level_bpe(writer: gguf.GGUFWriter, data: dict, vocab_size: int) -> None:
    tokens, types = _padded(vocab_size)
    for token, index in data["model"]["vocab"].items():
        if index < vocab_size:
            tokens[index], types[index] = token, T.NORMAL
    for added in data.get("added_tokens", []):
        if added["id"] < vocab_size:
            tokens[added["id"]] = added["content"]
            types[added["id"]] = T.CONTROL if added.get("special") else T.USER_DEFINED
    pre_tokenizer = json.dumps(data.get("pre_tokenizer"))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(next((name for key, name in PRE_TOKENIZERS if key in pre_tokenizer), "default"))
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges([" ".join(merge) for merge in _merges(data)])


def _add_sentencepiece_bpe(writer: gguf.GGUFWriter, data: dict, vocab_size: int) -> None:
    model = data["model"]
    tokens, types = _padded(vocab_size)
    scores = [-10000.0] * vocab_size
    merges = _merges(data)
    rank: dict[str, int] = {}
    for index, (left, right) in enumerate(merges):
        rank.setdefault(left + right, index)
    for token, index in model["vocab"].items():
        if index < vocab_size:
            tokens[index], scores[index] = token, -float(rank.get(token, len(merges)))
            types[index] = T.BYTE if _BYTE.fullmatch(token) else T.NORMAL
    if model.get("unk_token") in model["vocab"] and model["vocab"][model["unk_token"]] < vocab_size:
        types[model["vocab"][model["unk_token"]]] = T.UNKNOWN
    for added in data.get("added_tokens", []):
        index, token = added["id"], added["content"]
        if index >= vocab_size:
            continue
        if added.get("special") or _LOOK_SPECIAL.fullmatch(token):
            types[index] = T.CONTROL
        else:
            token, types[index] = token.replace(SPACE, " "), T.USER_DEFINED
        tokens[index], scores[index] = token, -1000.0
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_add_space_prefix(_adds_space_prefix(data))


def _padded(vocab_size: int) -> tuple[list[str], list[int]]:
    return [f"[PAD{index}]" for index in range(vocab_size)], [T.UNUSED] * vocab_size


def _merges(data: dict) -> list[tuple[str, str]]:
    """tokenizer.json's merges as pairs (stored as "a b" strings or, newer, as [a, b] lists)."""
    merges = data["model"].get("merges") or []
    pairs = (merge.split(" ", 1) if isinstance(merge, str) else merge for merge in merges)
    return [(left, right) for left, right in pairs]


def _adds_space_prefix(data: dict) -> bool:
    """Whether the tokenizer puts ``▁`` before the text: a normalizer Prepend of it (Llama 2,
    Mistral, Phi-3) or a Metaspace pre-tokenizer that prepends (not Gemma's)."""
    steps = []
    for key, inner in (("normalizer", "normalizers"), ("pre_tokenizer", "pretokenizers")):
        step = data.get(key) or {}
        steps += step.get(inner, [step])
    return any(
        (step.get("type") == "Prepend" and step.get("prepend") == SPACE)
        or (
            step.get("type") == "Metaspace"
            and (step.get("prepend_scheme", "always") != "never" and step.get("add_prefix_space", True))
        )
        for step in steps
    )
