"""OpenAI-compatible HTTP endpoint over the engine (no Qt)."""
