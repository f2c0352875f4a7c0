"""Generation with a KV cache on a loaded run (``depthbench generate``, the
evaluators): the length buckets, the sampling, the jitted programs
(``decoder``) and the loop from prompts to timed completions."""
