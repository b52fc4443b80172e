"""The executable lifecycle: the compiled table and its ``transitions`` oracle, both generated
from the spec, and the pipeline that binds the spec's guards and effects to the runtime."""
