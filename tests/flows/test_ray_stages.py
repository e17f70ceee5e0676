"""The tiny world's real regen and capture stages on a local Ray cluster write the thread runner's
shards."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from eagle3.config.pipeline import PipelineConfig, with_overrides
from eagle3.serve.launch import reference_server


def _rows(stage_dir: Path) -> dict[str, list[int]]:
    """``{sample_id: input_ids}`` over the stage directory's finished shards."""
    out: dict[str, list[int]] = {}
    for path in sorted(stage_dir.glob("shard-*.parquet")):
        table = pq.read_table(path, columns=["sample_id", "input_ids"]).to_pydict()
        out.update(zip(table["sample_id"], table["input_ids"], strict=True))
    return out


def _regen_then_capture(config: PipelineConfig, prompts: str) -> tuple[Path, Path]:
    from flows.capture import capture_flow
    from flows.regen import regen_flow

    regen = regen_flow(config, prompts_dir=prompts)
    assert regen.done, regen
    return regen.out_dir, capture_flow(config, regen_dir=str(regen.out_dir)).features_dir


@pytest.mark.slow
def test_regen_and_capture_on_local_ray_write_the_same_shards_as_threads(
    tiny_config: PipelineConfig, prefect_harness: None, tmp_path: Path
):
    pytest.importorskip("prefect_ray", reason="needs the [ray] extra")
    from flows.discover import discover_flow
    from flows.normalize import normalize_flow

    small = ["mix.total=24", "normalize.shard_size=8", "regen.max_new_tokens=4"]  # 3 prompt shards
    with reference_server(None, extra_args=["--synthetic-tokens", "4"]) as server:
        base = with_overrides(
            tiny_config, [*small, f"regen.servers=[{server.url}]", f"root={tmp_path / 'threads'}"]
        )
        prompts = normalize_flow(base, discover_flow(base))
        threads = _regen_then_capture(base, prompts)
        ray_config = with_overrides(
            base,
            [
                f"root={tmp_path / 'ray'}",
                "orchestration.task_runner=ray",
                "orchestration.max_workers=2",
            ],
        )
        on_ray = _regen_then_capture(ray_config, prompts)
    for thread_dir, ray_dir in zip(threads, on_ray, strict=True):
        assert thread_dir.name == ray_dir.name, "same inputs, same fingerprint"
        expected = _rows(thread_dir)
        assert expected and _rows(ray_dir) == expected, (
            f"{ray_dir.parent.name} shards differ on Ray"
        )
