"""lm-evaluation-harness against the served adapters equals its own ``hf`` backend with PEFT.

Two local tasks (a jsonl each, written here; no download): a multiple-choice task scored by
log-likelihoods (echo + logprobs) and a generation task (generate_until). ``local-completions``
finds the tokenizer through the server (``/tokenizer_info``, ``/tokenize``), so it gets none.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.slow

# None: the base model. Each case runs lm-eval twice (served, then hf with PEFT): one adapter and
# the base cover both paths; the engine's fidelity per adapter is tests/engine/test_fidelity.py's.
ADAPTERS = ["tiny-r8-all", None]
SUBJECTS = [
    "the sea",
    "a cat",
    "the moon",
    "bread",
    "a river",
    "the wind",
    "a violin",
    "snow",
    "a key",
    "fire",
]
WORDS = [
    " blue", " a green leaf", " red", " quiet", " very large", " cold", " soft and warm", " old",
    " bright", " heavy", " sweet", " a little dark", " loud", " round", " sharp", " calm",
]  # fmt: skip
BATCH = 8


def write_tasks(root: Path) -> None:
    """A 20-document multiple-choice task and a 10-document generation task, as lm-eval YAML + jsonl."""
    choice_docs = [
        {
            "question": f"What is {subject} like{'?' if i < 10 else ', really?'}",
            "choices": [WORDS[(3 * i + 5 * j) % len(WORDS)] for j in range(4)],
            "answer": i % 4,
        }
        for i, subject in enumerate(SUBJECTS * 2)
    ]
    generation_docs = [{"prompt": f"A story about {subject}:", "target": " It"} for subject in SUBJECTS]
    tasks = {
        "studio_choice": (
            choice_docs,
            {
                "output_type": "multiple_choice",
                "doc_to_text": "Question: {{question}}\nAnswer:",
                "doc_to_choice": "{{choices}}",
                "doc_to_target": "answer",
                "metric_list": [{"metric": "acc"}],
            },
        ),
        "studio_generation": (
            generation_docs,
            {
                "output_type": "generate_until",
                "doc_to_text": "{{prompt}}",
                "doc_to_target": "{{target}}",
                "generation_kwargs": {"until": ["\n", "."], "max_gen_toks": 12, "do_sample": False},
                "metric_list": [{"metric": "exact_match"}],
            },
        ),
    }
    for name, (docs, config) in tasks.items():
        data = root / f"{name}.jsonl"
        data.write_text("".join(json.dumps(doc) + "\n" for doc in docs))
        local = {"dataset_path": "json", "dataset_kwargs": {"data_files": {"test": str(data)}}}
        task = {"task": name, **local, "test_split": "test", **config}
        (root / f"{name}.yaml").write_text(yaml.safe_dump(task, sort_keys=False))


def evaluate(model: Any, model_args: dict | None, tasks_dir: Path) -> dict:
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    results = simple_evaluate(
        model=model,
        model_args=model_args,
        tasks=["studio_choice", "studio_generation"],
        task_manager=TaskManager(include_path=str(tasks_dir), include_defaults=False),
        batch_size=BATCH,
        log_samples=True,
        bootstrap_iters=0,
        verbosity="WARNING",
    )
    assert results is not None
    return results


def per_document(results: dict, task: str) -> list[dict]:
    return sorted(results["samples"][task], key=lambda sample: sample["doc_id"])


@pytest.fixture
def offline(monkeypatch):
    """lm-eval and datasets must not try the network: local json files, offline Hub."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("OPENAI_API_KEY", "unused")
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True, raising=False)


@pytest.mark.parametrize("adapter", ADAPTERS, ids=lambda a: a or "base")
def test_lm_eval_local_completions_equals_its_hf_peft_backend(
    serve, engine, tiny_model_dir, server_adapters, tmp_path, offline, adapter
):
    from lm_eval.models.openai_completions import LocalCompletionsAPI

    write_tasks(tmp_path)
    server = serve()
    remote = LocalCompletionsAPI(
        model=adapter or engine.model_name,
        base_url=f"{server.url}/v1/completions",
        max_length=engine.config.max_model_len,
        batch_size=BATCH,
    )
    assert remote.tokenizer_backend == "remote"  # found through the server: no tokenizer argument
    served = evaluate(remote, None, tmp_path)
    hf_args = {"pretrained": str(tiny_model_dir), "dtype": "float32", "device": "cpu"}
    if adapter is not None:
        hf_args["peft"] = str(server_adapters[adapter])
    local = evaluate("hf", hf_args, tmp_path)

    served_docs, local_docs = (per_document(r, "studio_choice") for r in (served, local))
    assert len(served_docs) == len(local_docs) == 20
    for ours, theirs in zip(served_docs, local_docs, strict=True):
        ours_ll = [resp[0] for resp in ours["filtered_resps"]]
        theirs_ll = [resp[0] for resp in theirs["filtered_resps"]]
        assert max(range(4), key=ours_ll.__getitem__) == max(range(4), key=theirs_ll.__getitem__)
        assert all(math.isclose(a, b, abs_tol=1e-3) for a, b in zip(ours_ll, theirs_ll, strict=True))
        assert ours["acc"] == theirs["acc"], ours["doc_id"]
    ours_acc = served["results"]["studio_choice"]["acc,none"]
    assert ours_acc == local["results"]["studio_choice"]["acc,none"]
    picks = {max(range(4), key=lambda j: doc["filtered_resps"][j][0]) for doc in served_docs}
    assert len(picks) > 1  # the documents' choices differ: the comparison means something

    served_docs, local_docs = (per_document(r, "studio_generation") for r in (served, local))
    assert len(served_docs) == len(local_docs) == 10
    assert [d["filtered_resps"] for d in served_docs] == [d["filtered_resps"] for d in local_docs]
    assert any(d["filtered_resps"][0] for d in served_docs)  # something was generated
    assert [d["exact_match"] for d in served_docs] == [d["exact_match"] for d in local_docs]
