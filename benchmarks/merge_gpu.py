"""Merging an adapter into an 8B-shaped base, and what serving the merged model gains.

    python -m benchmarks.merge_gpu [--shape llama3-8b] [--rounds 3] [--device cuda] [--json PATH]

Writes a random base checkpoint of the shape (bf16, 5 GB shards) and a random rank-16 adapter
on all seven projections, merges them with ``merge_and_export`` in a child process (its time
and peak resident memory: the bound docs/merge.md states), then serves, in two engines side by
side on the GPU, the base with the adapter and the merged model as a base: single-stream decode
tok/s (128-token prompt, 128 new tokens), rounds alternating, medians; the plain base for
reference. The merged model's greedy tokens are compared with base + adapter's.
"""

from __future__ import annotations

import json
import logging
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.engine_gpu import run_batch
from benchmarks.rounds import device_name, parser, report_json
from multilora_studio.bench.random_adapters import write_random_adapter
from multilora_studio.engine import Engine, EngineConfig
from multilora_studio.engine.model.model_source import RANDOM_SHAPES
from multilora_studio.engine.model.model_spec import ModelSpec
from multilora_studio.merge.shard_writer import PlannedTensor, plan_shards, write_checkpoint

MERGE_CHILD = """
import json, resource, sys, threading, time
from pathlib import Path
from multilora_studio.merge import AdapterSource, BaseSource, MergeRequest, merge_and_export
base, adapter, out = map(Path, sys.argv[1:])
source = AdapterSource("random", str(adapter), "", "", 16, (), "LoRA")
peak_anon = [0]
def sample():  # anonymous resident memory (the process's own, not file pages), every 20 ms
    while True:
        for line in open("/proc/self/status"):
            if line.startswith("RssAnon:"):
                peak_anon[0] = max(peak_anon[0], int(line.split()[1]) * 1024)
        time.sleep(0.02)
threading.Thread(target=sample, daemon=True).start()
start = time.perf_counter()
result = merge_and_export(MergeRequest(base, BaseSource("random", "", "", ""), (adapter,), (source,), out))
seconds = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"seconds": seconds, "peak_rss_bytes": peak, "peak_anon_bytes": peak_anon[0],
                  "bytes": result.total_bytes,
                  "shards": len(result.files)}))
"""


def hf_config(spec: ModelSpec) -> dict:
    """A transformers config.json for a Llama-family spec (plain RoPE)."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": spec.model_type,
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
        "rms_norm_eps": spec.rms_norm_eps,
        "tie_word_embeddings": spec.tie_word_embeddings,
        "attention_bias": spec.attention_bias,
        "max_position_embeddings": spec.max_position_embeddings,
        "rope_theta": spec.rope.theta,
        "hidden_act": "silu",
        "eos_token_id": list(spec.eos_token_ids),
        "torch_dtype": "bfloat16",
    }


def write_random_base(spec: ModelSpec, folder: Path, device: str) -> None:
    """Random bf16 weights (std 0.02, norms 1) streamed into 5 GB shards."""
    folder.mkdir(parents=True)
    hidden, inter = spec.hidden_size, spec.intermediate_size
    shapes = {"model.embed_tokens.weight": (spec.vocab_size, hidden), "model.norm.weight": (hidden,)}
    if not spec.tie_word_embeddings:
        shapes["lm_head.weight"] = (spec.vocab_size, hidden)
    for layer in range(spec.num_layers):
        prefix = f"model.layers.{layer}"
        shapes |= {
            f"{prefix}.input_layernorm.weight": (hidden,),
            f"{prefix}.post_attention_layernorm.weight": (hidden,),
            f"{prefix}.self_attn.q_proj.weight": (spec.q_size, hidden),
            f"{prefix}.self_attn.k_proj.weight": (spec.kv_size, hidden),
            f"{prefix}.self_attn.v_proj.weight": (spec.kv_size, hidden),
            f"{prefix}.self_attn.o_proj.weight": (hidden, spec.q_size),
            f"{prefix}.mlp.gate_proj.weight": (inter, hidden),
            f"{prefix}.mlp.up_proj.weight": (inter, hidden),
            f"{prefix}.mlp.down_proj.weight": (hidden, inter),
        }
    planned = [PlannedTensor(name, shape, torch.bfloat16) for name, shape in sorted(shapes.items())]

    def value(tensor: PlannedTensor) -> torch.Tensor:
        if tensor.name.endswith("norm.weight"):
            return torch.ones(tensor.shape, dtype=torch.bfloat16)
        return (torch.randn(tensor.shape, device=device) * 0.02).to(torch.bfloat16).cpu()

    write_checkpoint(folder, plan_shards(planned, 5 * 10**9), value)
    (folder / "config.json").write_text(json.dumps(hf_config(spec), indent=2))


def main() -> None:
    arguments = parser(__doc__)
    arguments.add_argument("--shape", default="llama3-8b")
    arguments.add_argument("--device", default="cuda")
    args = arguments.parse_args()
    logging.basicConfig(level=logging.INFO)
    spec = RANDOM_SHAPES[args.shape]
    workdir = Path(tempfile.mkdtemp(prefix="mls-merge-bench-"))
    base, adapter, merged = workdir / "base", workdir / "adapter", workdir / "merged"
    results: dict = {"shape": args.shape, "device": device_name(args.device)}
    start = time.perf_counter()
    write_random_base(spec, base, args.device)
    results["write_base_s"] = round(time.perf_counter() - start, 1)
    write_random_adapter(spec, adapter, 16, dtype=torch.bfloat16)
    child = subprocess.run(
        [sys.executable, "-c", MERGE_CHILD, str(base), str(adapter), str(merged)],
        capture_output=True,
        text=True,
        check=True,
    )
    results["merge"] = json.loads(child.stdout.strip().splitlines()[-1])
    report_json(results)

    settings = dict(
        device=args.device, dtype="bfloat16", max_loras=4, max_lora_rank=16, max_num_seqs=8,
        max_model_len=512, max_num_batched_tokens=1024, kv_cache_memory_gb=4.0,
    )  # fmt: skip
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, spec.vocab_size, (128,), generator=generator).tolist()
    runs: dict[str, list[float]] = {"base + adapter": [], "merged": [], "base": []}
    with (
        Engine(EngineConfig(model=str(base), **settings)) as served,
        Engine(EngineConfig(model=str(merged), **settings)) as merged_engine,
    ):
        served.add_adapter("random", adapter)
        cases = {
            "base + adapter": (served, "random"),
            "merged": (merged_engine, None),
            "base": (served, None),
        }
        for engine, name in cases.values():
            run_batch(engine, [prompt], [name], 16)  # warm-up: graphs, slot upload
        tokens = {}
        for _ in range(args.rounds):
            for case, (engine, name) in cases.items():
                run = run_batch(engine, [prompt], [name], 128)
                runs[case].append(run["decode_tok_s"])
                tokens[case] = run["tokens"][0]
    results["single_stream_decode_tok_s"] = {case: round(statistics.median(v), 1) for case, v in runs.items()}
    medians = results["single_stream_decode_tok_s"]
    results["merged_vs_base"] = round(medians["merged"] / medians["base"], 3)
    results["adapter_vs_base"] = round(medians["base + adapter"] / medians["base"], 3)
    same = sum(a == b for a, b in zip(tokens["merged"], tokens["base + adapter"], strict=True))
    results["greedy_tokens_equal_first"] = next(
        (
            i
            for i, (a, b) in enumerate(zip(tokens["merged"], tokens["base + adapter"], strict=True))
            if a != b
        ),
        len(tokens["merged"]),
    )
    results["greedy_tokens_same"] = same
    report_json(results, args.json)


if __name__ == "__main__":
    main()
