"""Hyperparameter search as many ordinary training runs: the search space, Optuna's seeded sampler, the
rungs of successive halving and the study's records (docs/tuning.md)."""
