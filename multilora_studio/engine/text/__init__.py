"""Text to token ids and back: prompts and chat templates (an adapter's own rendered in a
sandbox), special tokens in chat content, and incremental detokenization."""
