"""Measured comparisons, each against a baseline measured in the same run: `make bench`."""
