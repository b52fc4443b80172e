"""stagefate inside real engines: each integration binds the spec's lifecycle to an engine's own
calls, KV pool, allocator and prefix cache (through :class:`~stagefate.runtime.engine.EngineCache`).

Only an engine's environment imports its integration; nothing else in stagefate imports these.
"""
