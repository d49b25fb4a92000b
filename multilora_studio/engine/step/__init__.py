"""One step on the device and what makes it ready: the runner, the eager inputs or the
captured graphs and their staging, the plans built at the start (LoRA, quantized GEMMs),
the device setup and kernel warm-up, and the trace of recent steps."""
