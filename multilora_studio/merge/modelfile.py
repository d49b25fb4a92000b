"""Ollama's ``Modelfile`` beside an exported GGUF: FROM the model, the chat template as TEMPLATE
(Ollama's Go template of the model's chat format, recognised from its Jinja template), the
format's stop tokens, and ADAPTER for a LoRA adapter on top of its base."""

from __future__ import annotations

from dataclasses import dataclass

# Ollama's templates of the chat formats, each with the marker that identifies it in a Jinja template
_CHATML = (
    "{{- range .Messages }}<|im_start|>{{ .Role }}\n{{ .Content }}<|im_end|>\n{{ end }}"
    "<|im_start|>assistant\n"
)
_LLAMA3 = (
    "{{- range .Messages }}<|start_header_id|>{{ .Role }}<|end_header_id|>\n\n{{ .Content }}<|eot_id|>"
    "{{- end }}<|start_header_id|>assistant<|end_header_id|>\n\n"
)
_GEMMA = (
    '{{- range .Messages }}<start_of_turn>{{ if eq .Role "assistant" }}model{{ else }}{{ .Role }}{{ end }}\n'
    "{{ .Content }}<end_of_turn>\n{{ end }}<start_of_turn>model\n"
)
_PHI3 = "{{- range .Messages }}<|{{ .Role }}|>\n{{ .Content }}<|end|>\n{{ end }}<|assistant|>\n"
_MISTRAL = (
    '{{- range .Messages }}{{ if eq .Role "user" }}[INST] {{ .Content }}[/INST]'
    '{{ else if eq .Role "assistant" }}{{ .Content }}</s>{{ end }}{{ end }}'
)


@dataclass(frozen=True)
class ChatFormat:
    marker: str
    template: str
    stops: tuple[str, ...]


CHAT_FORMATS = (
    ChatFormat("<|im_start|>", _CHATML, ("<|im_start|>", "<|im_end|>")),
    ChatFormat("<|start_header_id|>", _LLAMA3, ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")),
    ChatFormat("<start_of_turn>", _GEMMA, ("<start_of_turn>", "<end_of_turn>")),
    ChatFormat("<|assistant|>", _PHI3, ("<|end|>", "<|user|>", "<|assistant|>")),
    ChatFormat("[INST]", _MISTRAL, ("[INST]", "[/INST]")),
)


def modelfile(source: str, jinja_template: str, adapter: str | None = None) -> str:
    """The Modelfile text: FROM ``source`` (a GGUF file or a model folder), the chat format's
    TEMPLATE and stops when the Jinja template is one Ollama's formats match, ADAPTER ``adapter``."""
    lines = [f"FROM {source}"]
    if adapter is not None:
        lines.append(f"ADAPTER {adapter}")
    chat = next((item for item in CHAT_FORMATS if item.marker in jinja_template), None)
    if chat is None:
        lines.append("# chat template: Ollama reads it from the GGUF's tokenizer.chat_template")
    else:
        lines.append(f'TEMPLATE """{chat.template}"""')
        lines.extend(f'PARAMETER stop "{stop}"' for stop in chat.stops)
    return "\n".join(lines) + "\n"
