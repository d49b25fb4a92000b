"""Benchmarks of the engine against HF transformers + PEFT on the same machine."""
