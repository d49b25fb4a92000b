"""``multilora-studio bench``: workloads, backends, statistics and reports (GPU scripts: benchmarks/)."""
