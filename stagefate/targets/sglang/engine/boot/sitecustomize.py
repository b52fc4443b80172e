"""Interpreter start of every process of an SGLang engine stagefate launched (this folder is on
their ``PYTHONPATH``; :mod:`stagefate.targets.sglang.engine.standins` says what and why)."""

from stagefate.targets.sglang.engine import standins

standins.install()
