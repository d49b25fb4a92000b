"""The base model on the device: its shape (``ModelSpec``), where it comes from, its weights
(float or quantized at load), the Llama-family forward pass, and what that forward reads of
the adapters: the LoRA slots, DoRA's norms and the token tables."""
