"""The regen flow: one task per shard, shard_ids reruns only those, progress reaches 100, shard
table published."""

from __future__ import annotations

from pathlib import Path

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

from eagle3.config.pipeline import PipelineConfig
from eagle3.config.regen import RegenConfig
from eagle3.config.target import TargetConfig
from eagle3.serve.launch import reference_server


@pytest.fixture(scope="module")
def model_dir(request, tmp_path_factory) -> Path:
    try:
        import eagle3.worlds.world  # noqa: F401
    except ImportError:
        from eagle3.worlds.tiny_target import build_model, build_tokenizer

        out = tmp_path_factory.mktemp("tiny-target")
        tokenizer = build_tokenizer(
            [f"question {i} about topic {i % 5}" for i in range(300)], vocab_size=400
        )
        build_model(tokenizer, num_layers=4, max_position_embeddings=256).save_pretrained(out)
        tokenizer.save_pretrained(out)
        return out
    return Path(request.getfixturevalue("tiny_world").model_dir)


def _questions(shards: int = 2, rows: int = 6) -> list[list[dict]]:
    """``rows`` one-turn prompts rows in each of ``shards`` shards (``write_prompts_stage`` writes
    them)."""
    return [
        [
            {
                "sample_id": f"{s}-{i}",
                "source": "t",
                "messages": [{"role": "user", "content": f"question {s} {i}"}],
            }
            for i in range(rows)
        ]
        for s in range(shards)
    ]


def _artifacts(flow_run_id) -> list:
    with get_client(sync_client=True) as client:
        return client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
        )


@pytest.mark.slow
def test_regen_flow_runs_only_requested_shards_then_completes_with_progress(
    prefect_harness, tmp_path, model_dir, write_prompts_stage
):
    from flows.regen import regen_flow

    prompts = write_prompts_stage(tmp_path, _questions())
    with reference_server(
        None, extra_args=["--synthetic-tokens", "3", "--synthetic-delay", "0.01"]
    ) as server:
        config = PipelineConfig(
            name="flow-test",
            root=str(tmp_path),
            target=TargetConfig(
                model_path=str(model_dir), num_layers=8, hidden_size=128, vocab_size=2048
            ),
            regen=RegenConfig(servers=[server.url], concurrency_per_server=4, max_new_tokens=3),
        )
        first = regen_flow(config, shard_ids=[1], prompts_dir=str(prompts))
        out = first.out_dir
        assert first.summary["shards_pending"] == [0] and not first.done
        assert not (out / "shard-00000.parquet").exists() and (out / "shard-00001.parquet").exists()
        state = regen_flow(config, prompts_dir=str(prompts), return_state=True)
    result = state.result()
    summary = result.summary
    assert result.done and summary["ok"] + summary["truncated"] == 12
    artifacts = _artifacts(state.state_details.flow_run_id)
    progress = [a for a in artifacts if a.type == "progress"]
    assert progress and progress[-1].data == 100.0
    assert "ETA" in (progress[-1].description or "")
    assert any(a.type == "table" and a.key.startswith("regen-shards") for a in artifacts)
    assert any(a.type == "markdown" and a.key.startswith("regen-summary") for a in artifacts)
