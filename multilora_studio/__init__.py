"""MultiLoRA Studio: many LoRA adapters of one base model, batched on one GPU."""

__version__ = "0.1.0"
