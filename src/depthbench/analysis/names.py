"""Names shared by the analyses and the CLI (no jax import, so ``--help`` is fast)."""

METRICS = ("angular_distance", "causal_score", "permutation_score", "late_layer_interaction",
           "logit_lens", "token_collapse", "block_jacobian", "usefulness", "layer_pruning",
           "effective_depth", "depth_weights", "stream_diversity")

# A family's own analysis switches (attnres's skip, swap and probe rules) are
# declared in its module (capabilities.AnalysisOptions; registry.analysis_options).

# The causal score's normalisation: the original's ratio of token means first.
CAUSAL_RATIOS = ("of_means", "per_token")
