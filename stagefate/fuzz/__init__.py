"""Stateful fuzzing of the real pipeline, tree and torch runtime (Hypothesis)."""
