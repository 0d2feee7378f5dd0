"""Worked examples of user models, each a template to copy (see `examples/residual.py`)."""
