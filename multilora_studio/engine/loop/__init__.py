"""The worker thread's step loop and the channels to it: commands in, request streams and
metrics snapshots out; whole-request calls over ``submit``; timing hooks for benchmarks."""
