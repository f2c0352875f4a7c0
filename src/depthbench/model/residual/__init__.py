"""Residual families: one module per family, gathered in ``registry``."""
