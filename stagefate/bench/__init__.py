"""Benchmarks behind ``stagefate bench``; results go to ``docs/benchmarks.md``."""
