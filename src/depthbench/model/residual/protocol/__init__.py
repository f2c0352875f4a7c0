"""The residual protocol: what a family implements (``base``), may declare
(``capabilities``, ``original_format``), how its fields are typed
(``family_config``), and the registry that gathers the families."""
