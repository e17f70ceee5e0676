"""The wire between the capture process and its SGLang workers: JSON lines for control, one
shared-memory file per batch for the states. Torch and the standard library only: both interpreters
import it (the project's, and SGLang's runtime on this CPU), so neither side needs the other's
packages, and nothing is pickled.

* Control: one JSON object per line, the capture process to each worker on the worker's stdin
  (``forward`` with the batch's token ids, ``close``), each worker back on a pipe of its own
  (``ready``, ``done``, ``error``). A worker whose stdin reaches end-of-file exits: its capture
  process is gone.
* States: rank 0 writes a batch's tensors into one file under the backend's directory in
  ``/dev/shm`` (memory, not disk), each at a 64-byte-aligned offset, and replies with the layout.
  The capture process maps the file and unlinks it at once: the tensors it hands the writer are
  views of that mapping, which lives exactly as long as they do (the writer holds a batch until its
  part file is written), so nothing is copied on this side and nothing is left behind once the last
  view is dropped. A GPU worker's one copy is its device-to-host copy into the file.
"""

from __future__ import annotations

import json
import os
import select
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

import torch

ALIGN = 64  # bytes: every tensor starts at a multiple, so any dtype views in place
SHM_ROOT = Path("/dev/shm")


class ChannelClosed(RuntimeError):
    """The other end of a control pipe is gone (its process exited)."""


def send(stream: IO[str], message: Mapping[str, Any]) -> None:
    """Write ``message`` as one JSON line and flush it (raises ``ChannelClosed`` when the reader is
    gone)."""
    try:
        stream.write(json.dumps(message) + "\n")
        stream.flush()
    except (BrokenPipeError, ValueError) as exc:  # ValueError: the stream was closed here
        raise ChannelClosed(str(exc)) from None


class LineReader:
    """JSON lines from a pipe's file descriptor, with a deadline (``select`` on the raw descriptor:
    a buffered file's own buffer would hide lines from it)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._buffer = b""

    def read(self, timeout_s: float | None = None, *, alive: Any = None) -> dict[str, Any]:
        """The next message; ``TimeoutError`` after ``timeout_s``; ``ChannelClosed`` at end-of-file
        or when ``alive()`` turns false (checked every second while waiting)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while b"\n" not in self._buffer:
            left = 1.0 if deadline is None else min(1.0, deadline - time.monotonic())
            if left <= 0:
                raise TimeoutError(f"no message in {timeout_s:.0f}s")
            ready, _, _ = select.select([self.fd], [], [], left)
            if not ready:
                if alive is not None and not alive():
                    raise ChannelClosed("the process exited")
                continue
            chunk = os.read(self.fd, 1 << 20)
            if not chunk:
                raise ChannelClosed("end of file")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)


def shm_root() -> Path:
    """Where batch files live: ``/dev/shm`` (memory) when the system has it, else the temporary
    directory."""
    if SHM_ROOT.is_dir() and os.access(SHM_ROOT, os.W_OK):
        return SHM_ROOT
    import tempfile

    return Path(tempfile.gettempdir())


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def write_tensors(path: Path, tensors: Mapping[str, torch.Tensor]) -> list[dict[str, Any]]:
    """Write ``tensors`` (any device) into the file ``path`` (through ``path.tmp``, renamed when
    complete) and return the layout ``read_tensors`` needs: name, dtype, shape and byte offset of
    each."""
    layout, offset = [], 0
    for name, tensor in tensors.items():
        dtype = str(tensor.dtype).removeprefix("torch.")
        layout.append({"name": name, "dtype": dtype, "shape": list(tensor.shape), "offset": offset})
        offset += _aligned(tensor.numel() * tensor.element_size())
    tmp = path.with_name(path.name + ".tmp")
    mapped = torch.from_file(str(tmp), shared=True, size=max(offset, 1), dtype=torch.uint8)
    for entry, tensor in zip(layout, tensors.values(), strict=True):
        _view(mapped, entry).copy_(tensor)
    del mapped  # unmapped; the bytes stay in the file
    tmp.rename(path)
    return layout


def read_tensors(path: Path, layout: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """The tensors of a file ``write_tensors`` wrote, as views of one shared mapping of it; the file
    is unlinked before returning (the mapping keeps its memory until the last view is gone)."""
    size = max((_end(entry) for entry in layout), default=1)
    mapped = torch.from_file(str(path), shared=True, size=max(size, 1), dtype=torch.uint8)
    path.unlink()
    return {entry["name"]: _view(mapped, entry) for entry in layout}


def _end(entry: dict[str, Any]) -> int:
    dtype = getattr(torch, entry["dtype"])
    numel = 1
    for dim in entry["shape"]:
        numel *= dim
    return entry["offset"] + numel * dtype.itemsize


def _view(mapped: torch.Tensor, entry: dict[str, Any]) -> torch.Tensor:
    dtype = getattr(torch, entry["dtype"])
    return mapped[entry["offset"] : _end(entry)].view(dtype).view(entry["shape"])
