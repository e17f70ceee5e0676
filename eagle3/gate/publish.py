"""Publishing a draft on the Hugging Face Hub: the model card a Hub page needs, and one commit of
the export.

Design choices:

* The card opens with the Hub's YAML metadata (``export_format.card_metadata``: ``license``,
  ``base_model`` = the target, ``library_name``, ``tags`` eagle3 / speculative-decoding / sglang) so
  the page is found from the target's page and by tag, then the export's card, then what
  the gate measured (speedup and accept length at the decision concurrency, the thresholds) and the
  exact SGLang command that serves the target with this draft from the Hub, built by the gate's own
  launch builder.
* The upload is planned first (``plan_upload``: the card written under ``<root>/hub/<draft id>/``,
  every file with its path in the repo); ``--dry-run`` stops there and lists it, so what would be
  published can be read before it is. The export directory itself is never rewritten (the registry's
  copy of a champion stays as promoted).
* The token is ``HF_TOKEN`` (filled from the Prefect Secret block ``eagle3-hf-token`` when one
  exists and the environment has none) or the token ``hf auth login`` saved: ``huggingface_hub``'s
  own lookup (``eagle3.runtime.secrets``).
  It is handed to ``HfApi`` only, never logged or written.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle3.config.base import ConfigError
from eagle3.config.gate import SpeculativeConfig
from eagle3.config.pipeline import PipelineConfig
from eagle3.gate.report import GateReport, read_report
from eagle3.gate.report_md import profile_line
from eagle3.model.export_format import (
    CARD_FILE,
    CONFIG_FILE,
    HUB_ID,
    WEIGHTS_FILE,
    attention_summary,
    front_matter,
)
from eagle3.registry import Registry
from eagle3.rundir.runroot import atomic_write_text
from eagle3.runtime.secrets import hf_token
from eagle3.serve.launch_commands import build_launch

logger = logging.getLogger(__name__)

HUB_DIR = "hub"  # <root>/hub/<draft id>/README.md: the card of a planned upload
SERVE_PORT = 30000  # SGLang's default port, for the card's command when the config names none


@dataclass(frozen=True)
class HubUpload:
    """What one push commits: ``files`` maps each path in the repo to the local file uploaded
    there."""

    repo_id: str
    card: Path
    files: dict[str, Path]

    def listing(self) -> list[str]:
        return [
            f"{name}\t{path.stat().st_size} bytes\t{path}"
            for name, path in sorted(self.files.items())
        ]


def launch_line(config: PipelineConfig, repo_id: str, speculative: dict[str, Any] | None) -> str:
    """The SGLang command serving the target with the draft pulled from ``repo_id`` (the gate's best
    config), on GPUs (a recipe run on this CPU would otherwise print the command of the project's
    local runtime)."""
    spec = SpeculativeConfig(**speculative) if speculative else config.speculative
    port = config.server.port or SERVE_PORT
    served = config.replace(server=config.server.replace(device="cuda"))
    return build_launch(
        served, "eagle3", engine="sglang", draft=repo_id, speculative=spec, port=port
    ).shell()


def gate_section(report: GateReport | None, speculative: dict[str, Any] | None) -> list[str]:
    if report is None:
        return ["## Gate", "", "Not gated: this export was pushed before any gate measured it.", ""]
    t = report.thresholds
    verdict = "PASS" if report.passed else "FAIL"
    lines = [
        "## Gate",
        "",
        f"Verdict: **{verdict}** (report fingerprint `{report.fingerprint}`) on the traffic "
        f"profile {profile_line(t)} (concurrency: share); thresholds: weighted speedup >= {t['min_speedup']}, "
        f"accept length >= {t['min_accept']}.",
        "",
        "| draft | passed | speedup | accept length | gain over champion |",
        "|---|---|---:|---:|---:|",
    ]
    for d in report.decisions:
        lines.append(
            f"| `{Path(d.draft).name}` | {d.passed} | {_num(d.speedup)} | {_num(d.accept_length)} | "
            f"{_num(d.gain_over_champion)} |"
        )
    if speculative:
        lines += ["", f"Best speculative config: `{speculative}`"]
    return [*lines, ""]


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def hub_card(
    config: PipelineConfig,
    repo_id: str,
    body: str,
    report: GateReport | None,
    speculative: dict[str, Any] | None,
    architecture: str = "",
) -> str:
    """The published card: metadata, the export's card ``body``, the gate's numbers, the SGLang
    command (with the draft's ``architecture``: which attention SGLang builds,
    ``attention_summary``)."""
    attention = [f"Draft attention: {architecture}.", ""] if architecture else []
    command = ["```bash", launch_line(config, repo_id, speculative), "```", ""]
    serve = ["## Serve with SGLang", "", *attention, *command]
    return (
        front_matter(config)
        + body.rstrip()
        + "\n\n"
        + "\n".join([*gate_section(report, speculative), *serve])
    )


def _attention(config_json: Path) -> str:
    """``attention_summary`` of an export's ``config.json``; empty when it cannot say (no such
    file, an older or partial config)."""
    try:
        return attention_summary(json.loads(config_json.read_text()))
    except (OSError, ValueError, KeyError):
        return ""


def plan_upload(
    config: PipelineConfig,
    export_dir: Path,
    repo_id: str,
    *,
    draft_id: str,
    report: GateReport | None = None,
    speculative: dict[str, Any] | None = None,
) -> HubUpload:
    """Write the card under ``<root>/hub/<draft_id>/`` and list what a push of ``export_dir``
    commits."""
    export_dir = Path(export_dir)
    if not HUB_ID.match(repo_id):
        raise ConfigError(f"Hub repo id {repo_id!r}: use <owner>/<name>")
    body_path = export_dir / CARD_FILE
    body = body_path.read_text() if body_path.exists() else ""
    # the export card's own metadata
    body = body.split("---\n", 2)[2] if body.startswith("---\n") else body
    card = config.root_path / HUB_DIR / draft_id / CARD_FILE
    architecture = _attention(export_dir / CONFIG_FILE)
    atomic_write_text(card, hub_card(config, repo_id, body, report, speculative, architecture))
    files = {name: export_dir / name for name in (CONFIG_FILE, WEIGHTS_FILE)} | {CARD_FILE: card}
    return HubUpload(repo_id, card, files)


def champion_upload(config: PipelineConfig, repo_id: str) -> HubUpload:
    """The upload of the run root's champion, its card carrying the numbers of the gate that
    promoted it."""
    champion = Registry(config.root_path).champion()
    if champion is None:
        raise ConfigError(
            f"no promoted draft under {config.root_path}/registry: gate a draft first (`eagle3 gate`)"
        )
    report = read_report(Path(champion.report).parent)
    return plan_upload(
        config,
        Path(champion.draft_dir),
        repo_id,
        draft_id=champion.draft_id,
        report=report,
        speculative=champion.speculative,
    )


def push(upload: HubUpload) -> str:
    """One Hub commit of the planned files (repo created if missing); returns the commit URL."""
    from huggingface_hub import CommitOperationAdd, HfApi

    token = hf_token()
    if not token:
        raise ConfigError(
            "no Hugging Face token: export HF_TOKEN, save a Prefect Secret block eagle3-hf-token, "
            "or run `hf auth login`"
        )
    api = HfApi(token=token)
    api.create_repo(upload.repo_id, exist_ok=True)
    operations = [
        CommitOperationAdd(path_in_repo=name, path_or_fileobj=str(path))
        for name, path in upload.files.items()
    ]
    info = api.create_commit(
        upload.repo_id, operations=operations, commit_message="Upload EAGLE-3 draft (eagle3)"
    )
    logger.info("pushed %d files to %s", len(operations), upload.repo_id)
    return str(info.commit_url)
