"""Evaluate adapters on the user's own prompts: prompt sets, checks, a batched runner, scores, exports.

Imports the engine, the adapters library and ``util``; never Qt or FastAPI.
"""

from multilora_studio.evaluate.checks import CHECK_KINDS, Check
from multilora_studio.evaluate.export import (
    FORMATS,
    default_results_dir,
    read_cells_csv,
    read_results_json,
    recent_results,
    render,
    save_results,
    write_export,
)
from multilora_studio.evaluate.library import record_scores
from multilora_studio.evaluate.prompt_set import PromptCase, PromptSet, load_prompt_set
from multilora_studio.evaluate.rerun import Rerun, changed_cells
from multilora_studio.evaluate.results import AdapterScore, Cell, EvalResults
from multilora_studio.evaluate.runner import EvalCancelled, EvalSettings, run_eval
from multilora_studio.run_records import BASE

__all__ = [
    "BASE",
    "CHECK_KINDS",
    "FORMATS",
    "AdapterScore",
    "Cell",
    "Check",
    "EvalCancelled",
    "EvalResults",
    "EvalSettings",
    "PromptCase",
    "PromptSet",
    "Rerun",
    "changed_cells",
    "default_results_dir",
    "load_prompt_set",
    "read_cells_csv",
    "read_results_json",
    "recent_results",
    "record_scores",
    "render",
    "run_eval",
    "save_results",
    "write_export",
]
