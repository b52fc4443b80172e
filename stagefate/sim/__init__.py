"""Trace replay: a scheduler simulation that drives a prefetch policy over a real trace."""
