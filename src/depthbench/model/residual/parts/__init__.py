"""Building blocks shared by some residual families (streams, Sinkhorn, depth
mixes, depth attention, the fused-kernel switch); no family is defined here."""
