"""The reference server's slowdown fault (the gate's noise injector): a seeded schedule of slow
request blocks, replayable from the seed, independent of the other faults' draws."""

from __future__ import annotations

import asyncio

import pytest

from eagle3.serve.reference import faults
from eagle3.serve.reference.args import parse_args
from eagle3.serve.reference.faults import FaultInjector, slow_schedule


def _slept(argv: list[str], requests: int, monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Seconds each of ``requests`` generation requests was held by the injector."""
    held: list[float] = []

    async def sleep(seconds: float) -> None:
        held[-1] += seconds

    monkeypatch.setattr(faults.asyncio, "sleep", sleep)
    injector = FaultInjector(parse_args(["--synthetic-tokens", "2", *argv]))

    async def run() -> None:
        for _ in range(requests):
            held.append(0.0)
            assert await injector.before() is None

    asyncio.run(run())
    return held


def test_slow_blocks_follow_the_seeded_schedule_block_by_block(monkeypatch):
    argv = [
        "--fault-slow-s",
        "0.5",
        "--fault-slow-fraction",
        "0.5",
        "--fault-slow-block",
        "3",
        "--fault-seed",
        "7",
    ]
    held = _slept(argv, 30, monkeypatch)
    expected = [0.5 if slow else 0.0 for slow in slow_schedule(7, 0.5, 10) for _ in range(3)]
    assert held == expected
    assert 0 < sum(held) < 15  # some blocks slow, some not: a slowdown for part of the run
    assert _slept(argv, 30, monkeypatch) == held  # the same seed replays the same schedule


def test_another_seed_moves_the_slow_blocks_and_other_faults_do_not(monkeypatch):
    base = ["--fault-slow-s", "1", "--fault-slow-fraction", "0.5"]
    seed0 = _slept([*base, "--fault-seed", "0"], 40, monkeypatch)
    assert _slept([*base, "--fault-seed", "1"], 40, monkeypatch) != seed0
    assert (
        _slept([*base, "--fault-seed", "0", "--fault-extra-latency", "0"], 40, monkeypatch) == seed0
    )
    assert FaultInjector(parse_args(["--synthetic-tokens", "2", *base])).enabled
    assert not FaultInjector(
        parse_args(["--synthetic-tokens", "2", "--fault-slow-fraction", "0.5"])
    ).enabled


@pytest.mark.parametrize(
    ("flag", "value"), [("--fault-slow-fraction", "1.5"), ("--fault-slow-block", "0")]
)
def test_bad_slowdown_flags_are_refused_with_the_flag_named(flag, value, capsys):
    with pytest.raises(SystemExit):
        parse_args(["--synthetic-tokens", "2", flag, value])
    assert flag in capsys.readouterr().err
