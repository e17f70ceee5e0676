"""Moves that do not stall the device: training batches to a GPU (pinned staging, a copy stream, the
consumer waits) and captured states back to the host (pinned, waited for on the writer's side)."""

from __future__ import annotations

import pytest
import torch

from eagle3.runtime.transfer import DeviceTransfer, HostCopy


def test_a_cpu_consumer_gets_its_batch_where_it_was_built_with_no_event():
    transfer = DeviceTransfer("cpu")
    staged = transfer.zeros(2, 3, dtype=torch.int64)
    batch, ready = transfer.moved(lambda: {"x": transfer.copy(staged)})
    assert ready is None and not transfer.pinned
    assert batch["x"].data_ptr() == staged.data_ptr()  # no copy on the CPU
    assert transfer.handed_out((batch, ready)) is batch


@pytest.mark.gpu
def test_a_gpu_consumer_stages_in_pinned_memory_on_its_own_gpu():
    transfer = DeviceTransfer("cuda")
    assert transfer.device == torch.device("cuda", torch.cuda.current_device())
    assert transfer.empty(4, 8, dtype=torch.bfloat16).is_pinned()
    assert transfer.zeros(4, dtype=torch.bool).is_pinned()


@pytest.mark.gpu
def test_a_gpu_consumer_reads_its_batch_only_after_the_copy_stream_wrote_it():
    """The copy is held back on its stream by a spinning kernel; the consumer's stream, idle, would
    read the destination at once if it did not wait for the copy's event, and see memory the copy
    has not written yet."""
    transfer = DeviceTransfer("cuda")
    for round_ in range(4):
        staged = transfer.empty(64, 1024, dtype=torch.float32)
        staged.copy_(torch.arange(64 * 1024, dtype=torch.float32).view(64, 1024) + round_)

        def build(staged: torch.Tensor = staged) -> dict[str, torch.Tensor]:
            torch.cuda._sleep(200_000_000)  # queued on the copy stream: ~0.1 s before the copy runs
            return {"x": transfer.copy(staged) * 2}

        moved = transfer.moved(build)
        got = transfer.handed_out(moved)["x"]
        assert torch.equal(got.cpu(), staged * 2), f"round {round_}"
        assert moved[1].query()  # the consumer's read waited for it


def test_states_on_the_cpu_are_kept_as_they_are_by_the_host_copy():
    to_host, x = HostCopy(), torch.arange(6.0)
    assert to_host(x) is x
    to_host.record()
    to_host.wait()


@pytest.mark.gpu
def test_states_copied_to_the_host_are_whole_once_the_wait_returns():
    """The state is computed behind a spinning kernel (a forward still running) and copied without
    waiting for it; ``wait`` must block until the copy has run, or the pinned buffer is read before
    it is written."""
    x = torch.arange(64 * 1024, dtype=torch.float32, device="cuda").view(64, 1024)
    # ~0.1 s on the current stream, like the forward that makes the states
    torch.cuda._sleep(200_000_000)
    to_host = HostCopy()
    host = to_host(x * 2)
    to_host.record()
    assert host.device.type == "cpu" and host.is_pinned()
    to_host.wait()
    assert torch.equal(host, torch.arange(64 * 1024, dtype=torch.float32).view(64, 1024) * 2)
