"""Every family and checkpoint form the engine serves runs in our model code and matches PEFT.

qwen2 (q/k/v biases), mistral, qwen3 (q/k norms per head), phi3 (fused q/k/v and gate/up in
the checkpoint), sliding windows (every layer, or qwen2's from ``max_window_layers`` on),
gemma2 and gemma3 (the text model, and the text decoder of the image-text model: its
adapter's vision-tower LoRA is not served, text never passes there), yarn and longrope RoPE,
a tied Llama 3.2 stored in fp16 with the shared matrix only as
``lm_head.weight``, and a sharded, tokenizer-less bf16 checkpoint: greedy tokens of two
adapters (different ranks and targets) and the base in one batch, each equal to PEFT's for
that adapter alone. Prompts plus 32 new tokens cross every sliding window.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from multilora_studio.engine import Engine, EngineConfig, SamplingParams
from tests.engine.reference import PeftReference
from tests.fixtures import FUSED_ADAPTERS, TINY_ADAPTERS, build_adapter

SPECS = [TINY_ADAPTERS[1], TINY_ADAPTERS[3]]
NEW_TOKENS = 32
# how the LoRA term and the q/k/v epilogue run: EngineConfig fields
PATHS = {
    "kernel-shrink": dict(lora_shrink_in_gemm=False),
    "shrink-in-gemm": dict(lora_shrink_in_gemm=True),
    "fused-qkv": dict(lora_shrink_in_gemm=True, fused_qkv_epilogue=True),  # Triton (interpreter on CPU)
}
INTERPRETED_NEW_TOKENS = 4


def new_tokens(path: str, engine_device: str, full: int = NEW_TOKENS) -> int:
    """Greedy tokens a mixed-batch comparison generates on ``path``: fewer where the fused q/k/v
    kernel runs in Triton's interpreter (a decode step of a few rows takes over a second of a
    CPU core there), all ``full`` elsewhere and in the GPU run. The comparison with PEFT is the
    same, only shorter: PEFT's first tokens do not depend on how many follow."""
    return INTERPRETED_NEW_TOKENS if path == "fused-qkv" and engine_device == "cpu" else full


CASES = [
    ("qwen2", "kernel-shrink"),
    ("qwen2", "shrink-in-gemm"),
    ("mistral", "kernel-shrink"),
    ("mistral", "shrink-in-gemm"),
    ("qwen3", "kernel-shrink"),
    ("qwen3", "shrink-in-gemm"),
    ("qwen2-yarn", "kernel-shrink"),
    ("qwen3-yarn", "fused-qkv"),
    ("llama3.2-tied", "shrink-in-gemm"),
    ("mistral-window", "kernel-shrink"),  # fused-qkv with windowed layers: gemma2's and gemma3's
    ("qwen2-window", "shrink-in-gemm"),
    ("gemma2", "kernel-shrink"),
    ("gemma2", "shrink-in-gemm"),
    ("gemma2", "fused-qkv"),
    ("gemma3", "kernel-shrink"),
    ("gemma3", "fused-qkv"),
    ("gemma3-image-text", "shrink-in-gemm"),
    ("phi3", "kernel-shrink"),
    ("phi3", "shrink-in-gemm"),
    ("llama-sharded-bf16-no-tokenizer", "kernel-shrink"),
]
TEXTS = ("Hello world, this is", "Numbers: 1 2 3", "Why is the sky")


def family_prompts(engine: Engine) -> list[list[int]]:
    """Three short prompts: the texts encoded, or token ids where the model has no tokenizer
    (where text is a clear error naming the folder)."""
    if engine.tokenizer is None:
        with pytest.raises(ValueError, match=re.escape(f"{engine.base.folder} has no tokenizer")):
            engine.encode(TEXTS[0])
        return [[1, 510, 2300, 44, 901], [1, 88, 3, 4, 5, 6], [1, 40000, 12, 7]]
    return [engine.encode(text) for text in TEXTS]


def run_mixed_batch(
    base, adapters, prompts_of, engine_device, max_tokens: int = NEW_TOKENS, **config
) -> tuple[list, list]:
    """Prompts and greedy outputs (``max_tokens`` each) of every adapter and the base in one batch."""
    engine_config = EngineConfig(
        model=str(base), device=engine_device, dtype="float32", max_lora_rank=32, max_model_len=128, **config
    )
    with Engine(engine_config) as engine:
        for name, path in adapters.items():
            engine.add_adapter(name, path)
        prompts = prompts_of(engine)
        names = [*adapters, None][: len(prompts)]
        outputs = engine.generate(
            prompts, names, SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
        )
    return list(zip(prompts, names, strict=True)), outputs


@pytest.mark.parametrize(("variant", "path"), CASES, ids=[f"{v}-{p}" for v, p in CASES])
def test_family_mixed_batch_matches_peft(variant, path, tiny_family_models, tmp_path, engine_device):
    base = tiny_family_models[variant]
    specs = FUSED_ADAPTERS if variant == "phi3" else SPECS  # PEFT names phi3's fused modules
    adapters = {spec.name: build_adapter(base, spec, tmp_path / spec.name) for spec in specs}
    reference = PeftReference(base, adapters)
    count = new_tokens(path, engine_device)
    rows, outputs = run_mixed_batch(base, adapters, family_prompts, engine_device, count, **PATHS[path])
    for (prompt, name), output in zip(rows, outputs, strict=True):
        assert output.token_ids == reference.greedy(name, prompt, count), (variant, name)


def test_longrope_picks_short_or_long_factors_per_sequence_as_peft(
    tiny_family_models, tmp_path, engine_device
):
    """A sequence that stays within ``original_max_position_embeddings`` (64) uses the short
    factors, one longer from its prompt on the long ones, in the same batch (as HF decides)."""
    base = tiny_family_models["llama-longrope"]
    adapters = {spec.name: build_adapter(base, spec, tmp_path / spec.name) for spec in SPECS}
    reference = PeftReference(base, adapters)
    short = [1, *range(300, 309)]  # 10 + 32 new tokens <= 64
    long, longer = [1, *range(500, 569)], [1, *range(900, 979)]  # 70 and 80 > 64

    def prompts_of(engine: Engine) -> list[list[int]]:
        return [short, long, longer]

    rows, outputs = run_mixed_batch(base, adapters, prompts_of, engine_device, **PATHS["kernel-shrink"])
    for (prompt, name), output in zip(rows, outputs, strict=True):
        assert output.token_ids == reference.greedy(name, prompt, NEW_TOKENS), name


def split_phi3_as_mistral(phi3: Path, target: Path) -> Path:
    """The same model as a mistral checkpoint: phi3's fused qkv_proj / gate_up_proj cut into
    q/k/v and gate/up (the block, the window and RoPE are the same in both)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(phi3), dtype=torch.float32)
    config = model.config
    fields = {
        key: getattr(config, key)
        for key in (
            "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
            "num_attention_heads", "num_key_value_heads", "max_position_embeddings",
            "rms_norm_eps", "tie_word_embeddings", "sliding_window", "rope_parameters",
        )
    }  # fmt: skip
    mistral = AutoModelForCausalLM.from_config(AutoConfig.for_model("mistral", head_dim=16, **fields))
    q, kv, inter = config.num_attention_heads * 16, config.num_key_value_heads * 16, config.intermediate_size
    state = {}
    for name, tensor in model.state_dict().items():
        if "qkv_proj" in name:
            for part, piece in zip(("q_proj", "k_proj", "v_proj"), tensor.split([q, kv, kv]), strict=True):
                state[name.replace("qkv_proj", part)] = piece
        elif "gate_up_proj" in name:
            for part, piece in zip(("gate_proj", "up_proj"), tensor.split([inter, inter]), strict=True):
                state[name.replace("gate_up_proj", part)] = piece
        else:
            state[name] = tensor
    mistral.load_state_dict(state)
    mistral.save_pretrained(str(target), safe_serialization=True)
    return target


def test_phi3_serves_adapters_on_the_split_projection_names(tiny_family_models, tmp_path, engine_device):
    """Adapters trained on the split names (q_proj ... up_proj) run on the fused phi3 checkpoint
    and equal PEFT's on the same model stored split, with a fused-name adapter in the batch."""
    phi3 = tiny_family_models["phi3"]
    split = split_phi3_as_mistral(phi3, tmp_path / "phi3-split")
    ids = [1, 510, 2300, 44, 901, 7]
    with torch.no_grad():  # the two checkpoints are the same model
        from transformers import AutoModelForCausalLM

        logits = [
            AutoModelForCausalLM.from_pretrained(str(folder)).eval()(torch.tensor([ids])).logits
            for folder in (phi3, split)
        ]
    torch.testing.assert_close(logits[0], logits[1], rtol=1e-5, atol=1e-5)
    split_adapters = {spec.name: build_adapter(split, spec, tmp_path / spec.name) for spec in SPECS}
    fused = FUSED_ADAPTERS[0]
    fused_adapters = {fused.name: build_adapter(phi3, fused, tmp_path / fused.name)}
    split_reference = PeftReference(split, split_adapters)
    fused_reference = PeftReference(phi3, fused_adapters)
    prompts = [ids, [1, 88, 3, 4, 5, 6], [1, 40000, 12, 7], [1, 2, 3]]

    def prompts_of(engine: Engine) -> list[list[int]]:
        return prompts

    rows, outputs = run_mixed_batch(
        phi3, {**split_adapters, **fused_adapters}, prompts_of, engine_device, **PATHS["shrink-in-gemm"]
    )
    for (prompt, name), output in zip(rows, outputs, strict=True):
        reference = fused_reference if name == fused.name else split_reference
        assert output.token_ids == reference.greedy(name, prompt, NEW_TOKENS), name


def test_gemma2_logprobs_equal_peft_with_the_final_soft_cap(tiny_family_models, tmp_path, engine_device):
    """Greedy tokens cannot see the final logit soft-cap (tanh keeps the order); log-probabilities
    can: each generated token's, for an adapter and the base in one batch, equals PEFT's."""
    base = tiny_family_models["gemma2"]
    spec = SPECS[0]
    adapters = {spec.name: build_adapter(base, spec, tmp_path / spec.name)}
    reference = PeftReference(base, adapters)
    prompts = [[1, 510, 2300, 44, 901], [1, 88, 3, 4, 5, 6]]
    names = [spec.name, None]
    config = EngineConfig(
        model=str(base), device=engine_device, dtype="float32", max_lora_rank=32, max_model_len=128
    )
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True, logprobs=1)
    with Engine(config) as engine:
        engine.add_adapter(spec.name, adapters[spec.name])
        outputs = engine.generate(prompts, names, params)
    for prompt, name, output in zip(prompts, names, outputs, strict=True):
        expected = reference.logprobs(name, prompt + output.token_ids[:-1])[len(prompt) - 1 :]  # [16, V]
        got = torch.tensor([entry.logprob for entry in output.logprobs])
        want = expected[torch.arange(len(output.token_ids)), torch.tensor(output.token_ids)]
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


BF16_VARIANTS = ("qwen3", "gemma2", "gemma3", "phi3", "mistral-window")


@pytest.mark.parametrize("variant", BF16_VARIANTS)
def test_family_in_bf16_is_as_close_to_float32_as_transformers(
    variant, tiny_family_models, tmp_path, engine_device
):
    """bf16 on CUDA (Triton kernels, CUDA graphs): the log-probability of each token the engine
    generates, for two adapters and the base in one batch, is as close to float32 PEFT's as
    PEFT's own in bf16 on the same GPU (within twice its error plus 0.02 nats). Greedy tokens
    cannot be compared here: bf16 rounding breaks near ties differently in any two kernels."""
    if engine_device != "cuda":
        pytest.skip("bf16 with the native kernels and CUDA graphs: a GPU run")
    base = tiny_family_models[variant]
    specs = FUSED_ADAPTERS if variant == "phi3" else SPECS
    adapters = {spec.name: build_adapter(base, spec, tmp_path / spec.name) for spec in specs}
    exact = PeftReference(base, adapters)
    rounded = PeftReference(base, adapters, dtype=torch.bfloat16, device="cuda")
    config = EngineConfig(
        model=str(base), device="cuda", dtype="bfloat16", max_lora_rank=32, max_model_len=128
    )
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True, logprobs=1)
    with Engine(config) as engine:
        for name, path in adapters.items():
            engine.add_adapter(name, path)
        prompts = family_prompts(engine)
        names = [*adapters, None][: len(prompts)]
        outputs = engine.generate(prompts, names, params)
    for prompt, name, output in zip(prompts, names, outputs, strict=True):
        ids, tokens = prompt + output.token_ids[:-1], torch.tensor(output.token_ids)
        rows = torch.arange(len(tokens))
        truth = exact.logprobs(name, ids)[len(prompt) - 1 :][rows, tokens]  # [N]
        theirs = rounded.logprobs(name, ids)[len(prompt) - 1 :][rows, tokens]
        ours = torch.tensor([entry.logprob for entry in output.logprobs])
        engine_error, peft_error = (ours - truth).abs().max().item(), (theirs - truth).abs().max().item()
        print(f"bf16 {variant} {name}: engine {engine_error:.4f} peft {peft_error:.4f} nats (max)")
        assert engine_error <= 2 * peft_error + 0.02, (variant, name, engine_error, peft_error)
