"""What SGLang ``SGLANG_VERSION`` needs to run on this CPU, applied in-process (see the package
docstring).

Design choices:
- The version is checked first, from the installed distribution's metadata, before any SGLang module
  is imported: the ports transcribe one release's kernels and call signatures, so any other release
  is refused in one line.
- ``sgl_kernel`` is this package's ``kernels`` module, registered under that name in ``sys.modules``
  before SGLang imports it; its two attention ops are registered as ``torch.ops.sgl_kernel.*``
  (``attention``). No ``convert_weight_packed`` op is defined, so SGLang's AMX weight-packing path
  stays off and every linear layer takes SGLang's own torch fallback (``cpu_has_amx_support()``
  reads False).
- ``intel_amx`` is the one attention backend of SGLang's CPU path with a draft backend (EAGLE-3
  needs one), and it is what drives the ported ops. SGLang rewrites it to ``torch_native`` on a CPU
  without AMX tiles; the platform fact ``has_amx`` is overridden through SGLang's own
  ``override_platform``, which that rewrite reads. Other AMX readers (weight packing,
  ``cpu_has_amx_support``) do not read it.
- torchvision (imported unconditionally by SGLang's multimodal configs) registers fake kernels for
  two ops that its CUDA build on the index cannot load on this machine (``torchvision::nms``,
  ``qnms``); defining their schemas first lets ``import torchvision`` succeed. Nothing here calls
  them.
"""

from __future__ import annotations

import importlib.metadata
import sys

from eagle3.serve.sglang import SGLANG_VERSION

TORCHVISION_OPS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)
_LIBRARIES: list = []  # torch.library.Library objects: their registrations last as long as they do


class RuntimeMismatch(RuntimeError):
    """The interpreter has no SGLang, or another release than the one the ports were written for."""


def check_version() -> str:
    """The installed SGLang's version; ``RuntimeMismatch`` (one line, how to install) unless it is
    the pinned one."""
    try:
        found = importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        raise RuntimeMismatch(
            f"no SGLang in {sys.executable}: install the CPU runtime with `bash infra/dev.sh sglang`"
        ) from None
    if found != SGLANG_VERSION:
        raise RuntimeMismatch(
            f"SGLang {found} in {sys.executable}, but the CPU kernels are ported for SGLang {SGLANG_VERSION} only: "
            "install the pinned runtime with `bash infra/dev.sh sglang`"
        )
    return found


def _guard_torchvision() -> None:
    import torch

    # imported, or its C++ ops loaded
    if "torchvision" in sys.modules or hasattr(torch.ops.torchvision, "nms"):
        return
    library = torch.library.Library("torchvision", "FRAGMENT")
    for schema in TORCHVISION_OPS:
        try:
            library.define(schema)
        except RuntimeError:  # a torchvision whose C++ ops did load defines them itself
            continue
    _LIBRARIES.append(library)


def install() -> None:
    """Apply the shim in this process (idempotent); raises ``RuntimeMismatch`` on a wrong SGLang."""
    if "sgl_kernel" in sys.modules:
        return
    check_version()
    _guard_torchvision()
    from eagle3.serve.sglang_cpu import attention, kernels

    _LIBRARIES.append(attention.register())
    sys.modules["sgl_kernel"] = kernels

    from sglang.srt.runtime_context import override_platform

    override_platform(has_amx=True).install()
