"""Hub push: the card's metadata, gate numbers and SGLang command, the dry-run file list, and the
token lookup."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml

from eagle3.config.base import ConfigError
from eagle3.config.gate import GateConfig
from eagle3.config.pipeline import PipelineConfig
from eagle3.config.target import TargetConfig
from eagle3.config.train import ExportConfig
from eagle3.gate.publish import champion_upload, push
from eagle3.gate.report import ArmResult, Decision, GateReport, LevelStats, write_report
from eagle3.registry import Registry

SPEC = {"algorithm": "EAGLE3", "num_steps": 5, "eagle_topk": 1, "num_draft_tokens": 6}


def _config(tmp_path: Path, model_path: str, base_model: str | None = None) -> PipelineConfig:
    return PipelineConfig(
        name="hub-test",
        root=str(tmp_path / "root"),
        target=TargetConfig(model_path=model_path, num_layers=8, hidden_size=128, vocab_size=2048),
        export=ExportConfig(license="apache-2.0", base_model=base_model),
    )


def _promote_champion(config: PipelineConfig, tmp_path: Path, cfg: dict | None = None) -> Path:
    export = tmp_path / "export"
    export.mkdir()
    cfg = cfg or {"architectures": ["LlamaForCausalLMEagle3"]}
    (export / "config.json").write_text(json.dumps(cfg))
    (export / "model.safetensors").write_bytes(b"weights")
    (export / "README.md").write_text(
        "---\nlicense: other\n---\n\n# EAGLE-3 draft for the target\n"
    )
    level = LevelStats(1, 4, 100, 40, 8.0, 125.0, 10.0, 2.5)
    gate = GateConfig(traffic={1: 1.0})
    report = GateReport(
        fingerprint="gatefp",
        target=config.target.model_path,
        thresholds=gate.model_dump(mode="json"),
        prompts={"chat": 4},
        arms=[ArmResult("cand0", "candidate", "http://x", draft=str(export), levels=[level])],
        decisions=[Decision(str(export), True, "cand0", 1.37, 2.5, None)],
        passed=True,
    )
    report_dir = tmp_path / "gate"
    write_report(report, report_dir)
    Registry(config.root_path).promote(export, report=report_dir / "report.json", speculative=SPEC)
    return export


def test_card_has_hub_metadata_gate_numbers_and_the_sglang_command(tmp_path: Path):
    config = _config(tmp_path, "meta-llama/Llama-3.1-8B-Instruct")
    _promote_champion(config, tmp_path)
    upload = champion_upload(config, "acme/llama-eagle3")
    card = upload.card.read_text()
    _, meta, body = card.split("---\n", 2)
    assert yaml.safe_load(meta) == {
        "license": "apache-2.0",
        "library_name": "sglang",
        "tags": ["eagle3", "speculative-decoding", "sglang"],
        "base_model": "meta-llama/Llama-3.1-8B-Instruct",
    }
    assert body.count("---\n") == 0, (
        "the export card's own metadata must not be repeated in the body"
    )
    assert (
        "# EAGLE-3 draft for the target" in body
        and "**PASS**" in body
        and "| 1.37 | 2.50 |" in body
    )
    (command,) = [line for line in body.splitlines() if "sglang.launch_server" in line]
    argv = shlex.split(command)
    assert argv[argv.index("--model-path") + 1] == "meta-llama/Llama-3.1-8B-Instruct"
    assert argv[argv.index("--speculative-draft-model-path") + 1] == "acme/llama-eagle3"
    assert argv[argv.index("--speculative-num-steps") + 1] == "5"
    assert argv[argv.index("--speculative-num-draft-tokens") + 1] == "6"


def test_an_mla_champions_card_says_which_attention_sglang_builds(tmp_path: Path):
    config = _config(tmp_path, "moonshotai/Kimi-K2.5")
    sizes = {
        "q_lora_rank": 1536,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
    }
    mla = {
        "architectures": ["Eagle3DeepseekV2ForCausalLM"],
        "num_attention_heads": 64,
        **sizes,
        "vocab_size": 163840,
        "draft_vocab_size": 163840,
    }
    _promote_champion(config, tmp_path, mla)
    body = champion_upload(config, "acme/kimi-eagle3-mla").card.read_text()
    assert (
        "Draft attention: MLA (`Eagle3DeepseekV2ForCausalLM`, 64 heads, q_lora_rank 1536, "
        "kv_lora_rank 512, qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128); "
        "full target vocab (no d2t)."
    ) in body


def test_dry_run_lists_the_champion_files_and_the_new_card_without_touching_the_export(
    tmp_path: Path,
):
    # a local target: base_model given
    config = _config(tmp_path, str(tmp_path), base_model="acme/tiny-target")
    export = _promote_champion(config, tmp_path)
    upload = champion_upload(config, "acme/tiny-eagle3")
    champion = Registry(config.root_path).champion()
    assert champion is not None
    assert upload.files == {
        "config.json": Path(champion.draft_dir) / "config.json",
        "model.safetensors": Path(champion.draft_dir) / "model.safetensors",
        "README.md": config.root_path / "hub" / champion.draft_id / "README.md",
    }
    assert [line.split("\t")[0] for line in upload.listing()] == [
        "README.md",
        "config.json",
        "model.safetensors",
    ]
    assert (
        yaml.safe_load(upload.card.read_text().split("---\n")[1])["base_model"]
        == "acme/tiny-target"
    )
    assert (export / "README.md").read_text().startswith("---\nlicense: other"), (
        "the export was rewritten"
    )
    with pytest.raises(ConfigError, match="<owner>/<name>"):
        champion_upload(config, "not a repo id")


def test_push_without_any_token_names_the_three_sources(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    from huggingface_hub import constants

    config = _config(tmp_path, "meta-llama/Llama-3.1-8B-Instruct")
    _promote_champion(config, tmp_path)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    with pytest.raises(ConfigError, match=r"HF_TOKEN.*eagle3-hf-token.*hf auth login"):
        push(champion_upload(config, "acme/llama-eagle3"))


def test_token_saved_by_hf_auth_login_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from huggingface_hub import constants

    from eagle3.runtime.secrets import hf_token

    monkeypatch.delenv("HF_TOKEN", raising=False)
    (tmp_path / "token").write_text("hf_saved_by_login")
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "token"))
    assert hf_token() == "hf_saved_by_login"
    monkeypatch.setenv("HF_TOKEN", "hf_from_env")
    assert hf_token() == "hf_from_env"
