"""Generation with a KV cache on a loaded run (``depthbench generate``, the evaluators).

* ``buckets``: the padded lengths programs are compiled for;
* ``sampling``: greedy, temperature, top-k and top-p choice of the next token;
* ``decoder``: :class:`~depthbench.generation.decoder.Decoder`, the jitted
  prefill and decode programs of a run (``model/decode.py``), sharded like the
  train step, one per batch and length bucket;
* ``loop``: :func:`~depthbench.generation.loop.generate`, batches of prompts
  to completions (EOS, stop strings, a token budget, the window) with time to
  first token and prefill/decode throughput.
"""
