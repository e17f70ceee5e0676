"""``capture.backend=sglang``: hidden states captured where the target is served, by SGLang's own
model runner.

``backend`` (the capture process: the registered backend, workers, the memory check), ``worker``
(SGLang's interpreter: one tensor-parallel rank of the model runner; the one module that touches
SGLang), ``channel`` (the wire both import: JSON lines for control, a shared-memory file per batch
for the states).
"""
