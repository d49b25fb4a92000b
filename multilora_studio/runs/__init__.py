"""Training runs followed as they write checkpoints: each checkpoint imported, served, scored on
the run's prompt set, and the run's ``RUN@latest`` / ``RUN@best`` aliases moved.

Imports the engine, the adapters library and ``evaluate``; never Qt or FastAPI.
"""

from multilora_studio.runs.follower import AliasTable, RunFollower, RunUpdate
from multilora_studio.runs.scores import BestPick, checkpoint_scores, clearly_better, pick_best, spread

__all__ = [
    "AliasTable",
    "BestPick",
    "RunFollower",
    "RunUpdate",
    "checkpoint_scores",
    "clearly_better",
    "pick_best",
    "spread",
]
