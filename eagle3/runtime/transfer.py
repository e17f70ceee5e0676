"""Moves between the host and a GPU that do not stall the device's work: batches to the trainer,
states from the target.

``DeviceTransfer`` (the training loader, ``FeatureDataset``): a CPU consumer uses a batch where it
is built. For a GPU the batch is staged in pinned (page-locked) memory and copied and decoded on a
CUDA stream of its own: a copy from pageable memory is a synchronous bounce through a driver buffer,
and any copy on the consumer's stream waits for the step queued before it and holds back the one
queued after it. The consumer's stream waits for that work's event when it takes the batch
(``handed_out``).

``HostCopy`` (capture, ``eagle3.capture.shard``): a GPU target's states come back into pinned
memory, queued on the current stream behind the forward that made them, so the capture thread goes
on to queue the next forward at once; the writer thread waits for the copies (``wait``) and does the
host work while the GPU computes. Reading a state (``.cpu()``, ``bool(...)``) on the capture thread
waited for the forward and left the GPU idle during the host work.

In both, the caching host allocator keeps each pinned buffer until its asynchronous copy has run.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

Tensors = dict[str, torch.Tensor]
# a batch on its device, and the event that marks it ready
Moved = tuple[Tensors, "torch.cuda.Event | None"]


class DeviceTransfer:
    """Staging buffers for ``device`` and the moves onto it; made on the consumer's thread, used on
    any."""

    def __init__(self, device: torch.device | str) -> None:
        device = torch.device(device)
        # the consumer's GPU, not the staging thread's
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        self.device, self.pinned = device, device.type == "cuda"
        self._stream: torch.cuda.Stream | None = None  # the copy stream, created on first use

    def empty(self, *shape: int, dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(*shape, dtype=dtype, pin_memory=self.pinned)

    def zeros(self, *shape: int, dtype: torch.dtype) -> torch.Tensor:
        return torch.zeros(*shape, dtype=dtype, pin_memory=self.pinned)

    def copy(self, staged: torch.Tensor) -> torch.Tensor:
        """``staged`` on the device (asynchronous from pinned memory; the tensor itself on the
        CPU)."""
        return staged.to(self.device, non_blocking=True)

    def moved(self, build: Callable[[], Tensors]) -> Moved:
        """``build()`` (which calls ``copy`` and decodes on the device) run on the copy stream, and
        its end event."""
        if not self.pinned:
            return build(), None
        if self._stream is None:
            self._stream = torch.cuda.Stream(self.device)
        with torch.cuda.stream(self._stream):
            batch, ready = build(), torch.cuda.Event()
            ready.record()
        return batch, ready

    def handed_out(self, moved: Moved) -> Tensors:
        """The batch, safe on the caller's current stream: that stream waits for the copy's event,
        and each tensor is marked in use there, so the allocator does not give its memory back to
        the copy stream while the step still reads it."""
        batch, ready = moved
        if ready is not None:
            stream = torch.cuda.current_stream(self.device)
            stream.wait_event(ready)
            for tensor in batch.values():
                tensor.record_stream(stream)
        return batch


class HostCopy:
    """Copies of device tensors to the host that do not wait for the device (module docstring): call
    it on each tensor, then ``record()`` once after the last; ``wait()`` (on any thread) blocks
    until all are on the host. Tensors already on the CPU are returned as they are."""

    def __init__(self) -> None:
        self._devices: set[torch.device] = set()
        self._done: list[torch.cuda.Event] = []

    def __call__(self, tensor: torch.Tensor) -> torch.Tensor:
        if not tensor.is_cuda:
            return tensor
        # spread by device_map: one stream per GPU the states come from
        self._devices.add(tensor.device)
        return torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True).copy_(
            tensor, non_blocking=True
        )

    def record(self) -> None:
        """Mark the end of the copies queued so far, on each device's current stream."""
        for device in self._devices:
            done = torch.cuda.Event()
            done.record(torch.cuda.current_stream(device))
            self._done.append(done)

    def wait(self) -> None:
        for done in self._done:
            done.synchronize()
