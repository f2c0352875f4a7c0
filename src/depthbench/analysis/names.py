"""Names shared by the analyses and the CLI (no jax import, so ``--help`` is fast)."""

METRICS = ("angular_distance", "causal_score", "permutation_score", "late_layer_interaction",
           "logit_lens", "token_collapse", "block_jacobian", "usefulness", "layer_pruning",
           "effective_depth", "depth_weights", "stream_diversity")

# Family-level analysis switches carried in spec.residual (first value: the
# original benchmark's definition, the default; docs/spec/analysis.md "Options").
ANALYSIS_OPTIONS = {
    "probe_rule": ("next_consumer", "readout"),
    "skip_rule": ("next_output", "remove"),
    "swap_rule": ("right_boundary", "block"),
}

# The causal score's normalisation: the original's ratio of token means first.
CAUSAL_RATIOS = ("of_means", "per_token")
