"""The one door to the target (``eagle3.target_io``): every stage reads the target's tokenizer,
config and weights through it, with the target's revision and ``trust_remote_code``.

The remote-code target is the tiny world's target whose tokenizer, config and model classes are
custom code in ``.py`` files beside the weights (``auto_map``), as Kimi-K2.5's tokenizer is:
transformers loads it only with ``trust_remote_code=True``. It is served by the reference server
from the plain tiny world (same weights and vocabulary), since a served target is the engine's
business, not the door's.
"""

from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from eagle3.config.pipeline import PipelineConfig, with_overrides
from eagle3.target_io import TargetRef, load_causal_lm, load_hf_config, load_tokenizer

REPO = Path(__file__).resolve().parents[2]
CODE = {
    "tokenization_house.py": "from transformers import PreTrainedTokenizerFast\n\n\n"
    "class HouseTokenizer(PreTrainedTokenizerFast):\n    pass\n",
    "configuration_house.py": "from transformers import LlamaConfig\n\n\n"
    "class HouseConfig(LlamaConfig):\n    model_type = 'house_llama'\n",
    "modeling_house.py": "from transformers import LlamaForCausalLM\n\n"
    "from .configuration_house import HouseConfig\n\n\n"
    "class HouseForCausalLM(LlamaForCausalLM):\n    config_class = HouseConfig\n",
}
AUTO_MAP = {
    "AutoConfig": "configuration_house.HouseConfig",
    "AutoModelForCausalLM": "modeling_house.HouseForCausalLM",
}


def _merge_json(path: Path, **changes: object) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}, indent=2))


@pytest.fixture(scope="module")
def remote_target(tiny_world, tmp_path_factory) -> Path:
    """A copy of the tiny world's target whose tokenizer, config and model are custom code."""
    out = tmp_path_factory.mktemp("remote-target") / "house-target"
    shutil.copytree(tiny_world.model_dir, out)
    for name, code in CODE.items():
        (out / name).write_text(code)
    _merge_json(
        out / "tokenizer_config.json",
        tokenizer_class="HouseTokenizer",
        auto_map={"AutoTokenizer": [None, "tokenization_house.HouseTokenizer"]},
    )
    _merge_json(
        out / "config.json",
        model_type="house_llama",
        architectures=["HouseForCausalLM"],
        auto_map=AUTO_MAP,
    )
    return out


def _remote(config: PipelineConfig, model_dir: Path, *overrides: str) -> PipelineConfig:
    return with_overrides(
        config, [f"target.model_path={model_dir}", "target.trust_remote_code=true", *overrides]
    )


def test_a_remote_code_target_loads_only_when_the_target_trusts_its_code(remote_target):
    loads = {
        "tokenizer": load_tokenizer,
        "config": load_hf_config,
        "weights": lambda target: load_causal_lm(target, dtype=torch.float32),
    }
    for what, load in loads.items():
        with pytest.raises(ValueError, match="contains custom code"):
            load(TargetRef(str(remote_target)))
        loaded = load(TargetRef(str(remote_target), trust_remote_code=True))
        assert type(loaded).__name__.startswith("House"), what


def test_every_load_passes_the_targets_revision_and_trust(remote_target, monkeypatch):
    import transformers

    seen: dict[str, dict] = {}
    inside: list[
        str
    ] = []  # transformers' own nested loads (a tokenizer's config) are not the door's
    for name in ("AutoTokenizer", "AutoConfig", "AutoModelForCausalLM"):
        cls = getattr(transformers, name)
        real = cls.from_pretrained.__func__

        def spy(cls, path, *args, _name=name, _real=real, **kwargs):
            if not inside:
                seen[_name] = kwargs
            inside.append(_name)
            try:
                return _real(
                    cls, path, *args, **{**kwargs, "revision": None}
                )  # a local directory has no commits
            finally:
                inside.pop()

        monkeypatch.setattr(cls, "from_pretrained", classmethod(spy))
    target = TargetRef(str(remote_target), revision="0123abc", trust_remote_code=True)
    load_tokenizer(target), load_hf_config(target), load_causal_lm(target, dtype=torch.float32)
    assert {
        name: (kw["revision"], kw["trust_remote_code"]) for name, kw in seen.items()
    } == dict.fromkeys(("AutoTokenizer", "AutoConfig", "AutoModelForCausalLM"), ("0123abc", True))


def test_the_plain_fast_path_gives_the_tokenizer_autotokenizer_gives(tiny_world, tiny_tokenizer):
    fast = load_tokenizer(TargetRef(str(tiny_world.model_dir)))
    messages = [{"role": "user", "content": "hi there"}, {"role": "assistant", "content": "hello!"}]
    assert type(fast) is type(tiny_tokenizer)
    assert fast.apply_chat_template(messages) == tiny_tokenizer.apply_chat_template(messages)


# --------------------------------------------------------------------------------------------------
# The door is the only way in: no load of the target's files elsewhere, and every stage passes its
# config's target.

TRANSFORMERS_LOADERS = {
    "AutoTokenizer",
    "AutoConfig",
    "AutoModelForCausalLM",
    "AutoModel",
    "PreTrainedTokenizerFast",
}
DOOR = {"load_tokenizer", "load_hf_config", "load_causal_lm", "tokenizer_imports"}


def _calls(path: Path) -> list[ast.Call]:
    return [node for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Call)]


def _sources() -> list[Path]:
    return sorted(p for top in ("eagle3", "flows") for p in (REPO / top).rglob("*.py"))


def test_only_the_door_calls_from_pretrained_on_the_targets_files():
    offenders = [
        f"{path.relative_to(REPO)}:{call.lineno}"
        for path in _sources()
        if path.name != "target_io.py" and "worlds" not in path.parts
        for call in _calls(path)
        if isinstance(call.func, ast.Attribute)
        and call.func.attr == "from_pretrained"
        and isinstance(call.func.value, ast.Name)
        and call.func.value.id in TRANSFORMERS_LOADERS
    ]
    assert offenders == [], "load the target through eagle3.target_io"


def test_every_door_call_passes_a_configs_target():
    """A stage hands the door its config's ``target`` (revision and trust_remote_code with it);
    only the reference server, which serves a local directory its flags name, and the served-traffic
    world, which renders requests for the tiny model it built itself, build a ``TargetRef``."""
    calls = [
        (path.relative_to(REPO), ast.unparse(call.args[0]) if call.args else "")
        for path in _sources()
        if path.name != "target_io.py"
        for call in _calls(path)
        if isinstance(call.func, ast.Name) and call.func.id in DOOR
    ]
    assert len(calls) >= 10
    others = {
        (str(path), arg) for path, arg in calls if arg != "target" and not arg.endswith(".target")
    }
    assert others == {
        (
            "eagle3/serve/reference/generator.py",
            "TargetRef(args.tokenizer_path or args.model_path)",
        ),
        ("eagle3/serve/reference/generator.py", "TargetRef(args.model_path)"),
        ("eagle3/worlds/served_traffic.py", "TargetRef(str(world.model_dir))"),
    }


# --------------------------------------------------------------------------------------------------
# The remote-code target through every stage that loads it: prompts, regen, capture, train, gate,
# scaling.


@pytest.fixture(scope="module")
def night(gate_world, remote_target, tmp_path_factory, write_prompts_stage):
    """The gate world's config on the remote-code target, a prompts stage of three rows, a
    reference server."""
    from eagle3.serve.launch import reference_server

    root = tmp_path_factory.mktemp("remote-night")
    rows = [
        {
            "sample_id": f"s{i}",
            "messages": [
                {"role": "user", "content": f"question {i} about topic {i}"},
                {"role": "assistant", "content": "an old answer"},
            ],
        }
        for i in range(3)
    ]
    prompts = write_prompts_stage(root, [rows])
    with reference_server(gate_world.model_dir, extra_args=["--num-threads", "1"]) as server:
        config = _remote(
            gate_world.config,
            remote_target,
            f"root={root}",
            f"regen.servers=[{server.url}]",
            "regen.max_new_tokens=4",
            "capture.dtype=float32",
            "scaling.eval_max_new_tokens=4",
        )
        yield config, prompts, gate_world.export


def test_a_remote_code_target_reaches_every_stage_that_loads_it(night, tiny_tokenizer):
    from eagle3.capture.stage import CaptureStage
    from eagle3.data.normalize import tokenizer_identity
    from eagle3.data.parquet import shard_metadata
    from eagle3.data.template import template_hash
    from eagle3.gate.release import gate_prompts
    from eagle3.regen.stage import RegenStage
    from eagle3.scaling.domain_eval import measure_offline
    from eagle3.stage import run_stage
    from eagle3.train.evaluate import accept_on_features
    from eagle3.train.identity import load_inputs

    config, prompts, export = night
    assert tokenizer_identity(
        config
    )  # the prompts stage's fingerprint (and its too_long check) read the tokenizer
    regen = run_stage(RegenStage(), config, prompts_dir=prompts)
    assert regen.done and regen.summary["ok"] + regen.summary["truncated"] == 3
    features = run_stage(CaptureStage(), config, regen_dir=regen.out_dir).out_dir
    shard = features / "shard-00000.parquet"
    assert shard_metadata(shard)["chat_template_hash"] == template_hash(tiny_tokenizer)
    vocab = features.parent / "vocab.safetensors"
    save_file(
        {
            k: v
            for k, v in load_file(str(export / "model.safetensors")).items()
            if k in ("d2t", "t2d")
        },
        str(vocab),
    )
    assert load_inputs(config, vocab).draft_config.hidden_size == config.target.hidden_size
    assert accept_on_features(config, export, shard, rows=2) >= 1.0
    assert len(gate_prompts(config, per_set=1)) == len(config.gate.prompt_sets)
    by_set = measure_offline(config, export, prompts / "shard-00000.parquet")
    assert by_set["test"]["prompts"] == 3
