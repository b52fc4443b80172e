"""stagefate's lifecycle as SGLang's buffer-mode pipeline (docs/sglang.md, "stagefate in
SGLang's engine").

Set ``STAGEFATE_SGLANG`` (:mod:`.settings`) in the scheduler's environment and call
:func:`.pipeline.install` in its process before SGLang builds its cache (the engine target's
startup hook does, :mod:`stagefate.targets.sglang.engine.standins`). The settings import
anywhere; the pipeline needs SGLang.
"""
