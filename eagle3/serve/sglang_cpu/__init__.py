"""SGLang's real serving stack on a CPU without SGLang's CPU kernels: kernels ported to torch,
pinned to one release.

This is not a server of ours. ``python -m eagle3.serve.sglang_cpu.launch <sglang flags>`` runs
SGLang ``SGLANG_VERSION`` itself (scheduler, radix cache, tokenizer manager, HTTP server, EAGLE-3
worker) with ``SGLANG_USE_CPU_ENGINE=1``. SGLang's CPU path imports its kernel package
``sgl_kernel``, whose only published wheel is a CUDA build; ``kernels`` and ``attention`` are torch
ports of the few CPU functions and ops that the plain and the EAGLE-3 server call, each a
transcription of the Triton kernel SGLang keeps for the same job and unit-tested against a direct
computation of what that kernel computes (``tests/unit/serve/sglang_cpu``).

Only the launcher imports this package (from the SGLang runtime's interpreter, ``infra/dev.sh
sglang``): the library never does, and it needs nothing but torch and SGLang. Nothing installed is
edited: ``shim.install`` runs at import of the launcher module, in the launcher and in every process
SGLang spawns from it (``multiprocessing``'s spawn re-imports the parent's main module by name in
each child).
"""

# the pin, kept outside the shim (re-exported)
from eagle3.serve.sglang import SGLANG_VERSION as SGLANG_VERSION
