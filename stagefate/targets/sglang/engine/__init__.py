"""SGLang's own engine as a target: its tokenizer manager, scheduler, model runner and
detokenizer serving a tiny model on a CPU, with HiCache buffer mode over a file L3
(docs/sglang.md, "SGLang's engine").

* :mod:`.standins` and ``boot/``: what must stand in at interpreter start in every process the
  engine spawns, and why;
* :mod:`.model`: the tiny Llama, random weights from a fixed seed;
* :mod:`.settings`: the engine's arguments and environment;
* :mod:`.driver` (the release's interpreter) and :mod:`.client` (this one): one engine, driven
  by JSON lines;
* :mod:`.books`: stagefate's look at SGLang's books inside the scheduler's process;
* :mod:`.serving`: whether a release's engine serves here, checked once and recorded.
"""
