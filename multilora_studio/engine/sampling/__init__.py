"""From a step's logits to its tokens, row by row: logits processors, grammar masks for
structured output, sampling and log-probabilities."""
