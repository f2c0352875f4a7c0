"""Training: optimizer and schedule, sharded train state and step, checkpoints,
metrics, and the run loop (``depthbench.train.loop.run``)."""
