"""Predicting an iteration before running it: the cluster's α–β costs, the compute profile, every exchange mode."""
