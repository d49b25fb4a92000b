"""Where adapters and base weights live: the adapters added (any thread), their host tier,
the worker's GPU slots and uploads, pinned host memory, loader threads and children,
and the base parked in host memory."""
