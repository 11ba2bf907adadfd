"""The client hook: what it costs a training step, on CPU and CUDA, and through an outage.

`Monitor.log()`, `watch()`, the batcher and the HTTP transport, each against a baseline."""
