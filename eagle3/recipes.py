"""Named recipes: functions that return full, validated pipeline configs, and ``resolve``, the one
way from what a user typed (a recipe name or a YAML path, plus ``a.b=value`` overrides) to a
validated config.

Recipes are typed the whole way: each builds its sections as config objects, and a variant is its
base with typed changes (``StrictModel.replace``); ``a.b=value`` strings are only what a user types.
Every recipe is loaded by a test (and its fingerprints compared with the golden file), so none can
rot. Paths resolve from ``EAGLE3_HOME`` (default ``~/.eagle3``): run roots under ``runs/<recipe>``,
the tiny worlds under ``cache/``. Nothing resolves from the working directory.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field

from eagle3.config.base import ConfigError
from eagle3.config.capture import CaptureConfig
from eagle3.config.data import MixConfig, NormalizeConfig, SourceConfig
from eagle3.config.dev import DevConfig
from eagle3.config.gate import GateConfig
from eagle3.config.pipeline import PipelineConfig, check_target_layers, load_yaml, with_overrides
from eagle3.config.regen import RegenConfig
from eagle3.config.sampling import SamplingProfile
from eagle3.config.served import ServedConfig
from eagle3.config.server import ServerLaunchConfig
from eagle3.config.target import TargetConfig
from eagle3.config.train import ExportConfig, TrainConfig, VocabConfig


def eagle3_home() -> Path:
    return Path(os.environ.get("EAGLE3_HOME", "~/.eagle3")).expanduser()


def world_cache() -> Path:
    """Where the dev worlds are cached (``$EAGLE3_HOME/cache``): the recipes, the tiny-world task,
    ``eagle3 dev``."""
    return eagle3_home() / "cache"


def _run_root(name: str) -> str:
    return str(eagle3_home() / "runs" / name)


# The mix of the 10x scaling run (chat-heavy with code, math and reasoning), as Hub sources.
_HUB_MIX: list[tuple[str, float]] = [
    ("sharegpt", 1.0),
    ("ultrachat", 1.0),
    ("perfect_blend", 1.0),
    ("openhermes", 0.8),
    ("magpie", 0.8),
    ("tulu3", 0.8),
    ("openthoughts", 0.5),
    ("opencodeinstruct", 0.5),
    ("smoltalk", 0.5),
    ("capybara", 0.3),
]


def _hub_sources() -> list[SourceConfig]:
    return [SourceConfig(adapter=name, weight=weight) for name, weight in _HUB_MIX]


def _gate_sets() -> dict[str, str]:
    return {"chat": "hub:mt-bench", "math": "hub:gsm8k", "code": "hub:humaneval"}


def _tiny_sources(data: Path) -> list[SourceConfig]:
    """The tiny world's sample files, one per dataset format the catalog reads, and a local JSONL
    with its columns."""
    local = SourceConfig(
        adapter="jsonl",
        name="local_qa",
        path=str(data / "local.jsonl"),
        columns={"user": "question", "assistant": "answer", "id": "uid"},
    )
    return [
        SourceConfig(adapter="sharegpt", path=str(data / "sharegpt.json")),
        SourceConfig(adapter="ultrachat", path=str(data / "ultrachat.parquet")),
        SourceConfig(adapter="perfect_blend", path=str(data / "perfect_blend.parquet")),
        SourceConfig(adapter="openhermes", path=str(data / "openhermes.json")),
        SourceConfig(adapter="magpie", path=str(data / "magpie.jsonl")),
        SourceConfig(adapter="tulu3", path=str(data / "tulu3.parquet")),
        local,
        SourceConfig(adapter="pretokenized", path=str(data / "pretokenized.parquet")),
    ]


# The gate's sampling (gate.sampling). The tiny recipes gate greedily and report the speedup at the
# temperature served targets are used at, single-stream (half the extra rounds of every level).
TINY_SAMPLING = {
    "greedy": SamplingProfile(),
    "sampled": SamplingProfile(temperature=1.0, top_p=0.95, decides=False, traffic={1: 1.0}),
}
# Kimi-K2.5 (Moonshot's guidance, fixed by its API) and GLM-5 (Z.ai's defaults) are served at
# temperature 1.0, top_p 0.95: that decides; greedy is reported beside it (published cards are
# greedy).
VENDOR_SAMPLING = {
    "served": SamplingProfile(temperature=1.0, top_p=0.95),
    "greedy": SamplingProfile(decides=False),
}
# Regen's sampling for the real targets: their answers at the sampling they are served with, not
# greedy. Greedy answers of a real model loop (SmolLM2: 29% of their 4-grams repeat, against 2%
# sampled), and on SmolLM2 a draft trained on sampled answers accepts more both greedily and at T=1
# (BENCHMARKS.md, "Greedy-regen vs sampled-regen"). The tiny recipes keep greedy regen: their
# target does not loop, and sampled answers cost its drafts accept length greedily.
SERVED_REGEN = {"temperature": 1.0, "top_p": 0.95}


def tiny() -> PipelineConfig:
    """CPU, minutes: the tiny world's sample data and tiny Llama target, the local reference server
    (``--set server.engine=sglang``: SGLang itself on this CPU)."""
    from eagle3.worlds.world import TinyWorldSpec, world_dir_for

    cache = world_cache()
    world = world_dir_for(cache, TinyWorldSpec())
    data = world / "data"
    return PipelineConfig(
        name="tiny",
        root=_run_root("tiny"),
        target=TargetConfig(
            model_path=str(world / "model"),
            num_layers=8,
            hidden_size=128,
            vocab_size=2048,
            context_length=1024,
            dtype="float32",
        ),
        sources=_tiny_sources(data),
        # minutes on 2 CPUs; `--set mix.total=null` takes every sample row
        mix=MixConfig(total=320, seed=0),
        gate=GateConfig(
            prompt_sets={
                name: str(data / "bench" / f"{name}.jsonl") for name in ("chat", "math", "code")
            },
            prompts_per_set=8,
            warmup_requests=2,
            max_new_tokens=64,
            traffic={1: 1.0, 4: 1.0},
            min_speedup=1.0,
            min_accept=1.2,
            # the tiny gate runs in several e2e tests: 3 rounds decide at c=1 on an idle machine
            min_rounds=2,
            max_rounds=3,
            # rounds of ~1 s on shared 2-core CI boxes: 32% seen idle with one thread
            max_baseline_drift=0.5,
            sampling=TINY_SAMPLING,
        ),
        normalize=NormalizeConfig(max_prompt_tokens=512, shard_size=200),
        regen=RegenConfig(
            concurrency_per_server=16,
            max_new_tokens=64,
            max_retries=3,
            backoff_base_s=0.05,
            backoff_max_s=1.0,
        ),
        capture=CaptureConfig(
            dtype="float32", batch_tokens=4096, max_seq_len=1024, row_group_bytes=4 << 20
        ),
        vocab=VocabConfig(draft_vocab_size=512),
        train=TrainConfig(
            precision="fp32",
            device="cpu",
            lr=3e-3,
            epochs=2,
            batch_size=4,
            max_seq_len=1024,
            save_every=50,
            log_every=5,
        ),
        server=ServerLaunchConfig(
            context_length=1024, port=0, device="cpu", mem_fraction_static=0.05
        ),
        dev=DevConfig(tiny_world=True, cache_dir=str(cache)),
    )


def tiny_think() -> PipelineConfig:
    """The tiny recipe on the thinking world (``eagle3.worlds.think_world``): agentic sources
    (OpenAI tool messages, ShareGPT with function calls, CoderForge and SWE-agent trajectories), a
    tiny target that thinks and calls tools in Kimi-K2.5's format, regen with its reasoning and
    tool-call parsers and thinking on, gate sets for thinking and tool use."""
    from eagle3.worlds.think_world import ThinkWorldSpec
    from eagle3.worlds.world import world_dir_for

    cache = world_cache()
    world = world_dir_for(cache, ThinkWorldSpec())
    data = world / "data"
    sources = [
        SourceConfig(adapter="jsonl", name="openai_tools", path=str(data / "openai_tools.jsonl")),
        SourceConfig(
            adapter="sharegpt",
            name="sharegpt_tools",
            path=str(data / "sharegpt_tools.json"),
            columns={"system": "system", "tools": "tools"},
        ),
        SourceConfig(adapter="coderforge", path=str(data / "coderforge.parquet")),
        SourceConfig(adapter="swe_agent", path=str(data / "swe_agent.parquet")),
    ]
    sets = {name: str(data / "bench" / f"{name}.jsonl") for name in ("think", "tools")}
    base = tiny()
    return base.replace(
        name="tiny_think",
        root=_run_root("tiny_think"),
        target=base.target.replace(model_path=str(world / "model")),
        sources=sources,
        mix=base.mix.replace(total=160),
        gate=base.gate.replace(prompt_sets=sets),
        regen=base.regen.replace(
            reasoning_parser="kimi_k2", tool_call_parser="kimi_k2", thinking=True, max_new_tokens=96
        ),
        dev=base.dev.replace(world="think"),
    )


def tiny_served() -> PipelineConfig:
    """The tiny night from served traffic alone: the request logs of the tiny target served by
    the reference server (``eagle3.worlds.served_traffic``) are the only source, every row skips
    regeneration (no server starts), a tenth of the requests is held out as the gate's prompt
    set, and the gate's load profile is the logs' (``gate.profile=served``)."""
    from eagle3.worlds.served_traffic import LOG_DIR, ServedTrafficSpec, traffic_dir_for

    base = tiny()
    logs = traffic_dir_for(world_cache(), ServedTrafficSpec()) / LOG_DIR
    return base.replace(
        name="tiny_served",
        root=_run_root("tiny_served"),
        sources=[SourceConfig(adapter="served", name="served", path=str(logs))],
        mix=base.mix.replace(total=None),
        served=ServedConfig(held_out=0.1),
        # the load and the prompts the logs record
        gate=base.gate.replace(profile="served", prompt_sets={}, max_levels=2),
        dev=base.dev.replace(world="served"),
    )


def tiny_served_mix() -> PipelineConfig:
    """The tiny night on served traffic and the public sample data together: served rows pass
    through regen as they were answered, the others are regenerated by the reference server."""
    served, base = tiny_served(), tiny()
    logs = served.sources[0].replace(weight=4.0)  # about as many served rows as the logs give
    return served.replace(
        name="tiny_served_mix",
        root=_run_root("tiny_served_mix"),
        sources=[*base.sources, logs],
        mix=base.mix.replace(total=480),
        gate=served.gate.replace(prompt_sets=base.gate.prompt_sets),
    )


def smollm2() -> PipelineConfig:
    """A real target on real data, on CPU: SmolLM2-135M-Instruct regenerating ShareGPT, gated on
    MT-bench (``eagle3.worlds.smollm2_world``: all three from the package registry, built once into
    the cache by the run's first task). ``--set server.engine=sglang`` runs it on SGLang itself.

    As SGLang serves this model: 30 layers, so aux layers ``[2, 15, 27]`` (input_of_layer; exported
    ``[1, 14, 26]``, SGLang's own default for L=30); float32 on both engines (the GGUF dequantised,
    ``target.dtype``); ChatML with the template's default system prompt
    (``normalize.system_prompt_policy=keep``: the template adds it to a conversation without one, as
    a chat server does); EOS ``<|im_end|>`` (id 2, the checkpoint's ``generation_config``). Sizes:
    ``mix.total`` conversations, their first ``regen.max_turns`` turns, answers of at most
    ``regen.max_new_tokens`` sampled at T=1, top_p 0.95 (``SERVED_REGEN``); the draft vocabulary
    covers what that data uses (BENCHMARKS.md, the real target). Train and gate sizes are set for a
    2-core CPU (README gives the measured time)."""
    from eagle3.worlds.smollm2_world import HUB_ID, SmolLM2WorldSpec, world_paths
    from eagle3.worlds.world import world_dir_for

    cache = world_cache()
    paths = world_paths(world_dir_for(cache, SmolLM2WorldSpec()))
    return PipelineConfig(
        name="smollm2",
        root=_run_root("smollm2"),
        target=TargetConfig(
            model_path=str(paths["model"]),
            num_layers=30,
            hidden_size=576,
            vocab_size=49_152,
            context_length=2048,
            dtype="float32",
        ),
        sources=[SourceConfig(adapter="sharegpt", path=str(paths["sharegpt"]))],
        mix=MixConfig(total=128, seed=0),
        normalize=NormalizeConfig(max_prompt_tokens=1024, shard_size=128),
        regen=RegenConfig(
            concurrency_per_server=16, max_new_tokens=128, max_turns=1, **SERVED_REGEN
        ),
        capture=CaptureConfig(
            dtype="float32", batch_tokens=8192, max_seq_len=2048, row_group_bytes=16 << 20
        ),
        # a few hundred ShareGPT answers use 500-3,000 distinct ids: 4,096 holds them, and the
        # draft's head (half its compute at 8,192 rows) trains no rows that nothing ever picks
        vocab=VocabConfig(draft_vocab_size=4096),
        train=TrainConfig(
            ttt_steps=4,  # the served chain is 3 drafts: a 4th step is margin, 7 doubles the cost
            precision="fp32",
            device="cpu",
            lr=1e-3,
            epochs=4,
            batch_size=4,
            max_seq_len=2048,
            save_every=100,
            log_every=10,
        ),
        # SGLang on a CPU checks that the machine's free memory after loading the weights stays
        # above (1 - fraction) of what was free before; on a shared box anyone's allocation counts
        # (seen: 0.056, then 0.112 needed for 540 MB of weights). The pool itself stays at
        # --max-total-tokens (8,192 tokens, 377 MB here), so the fraction only decides the check.
        server=ServerLaunchConfig(
            context_length=2048, port=0, device="cpu", mem_fraction_static=0.3
        ),
        gate=GateConfig(
            prompt_sets={"mt_bench": str(paths["mt_bench"])},
            prompts_per_set=8,
            warmup_requests=2,
            max_new_tokens=64,
            traffic={1: 1.0, 4: 1.0},
            min_rounds=2,
            max_rounds=4,
            max_baseline_drift=0.5,
        ),
        export=ExportConfig(base_model=HUB_ID, license="apache-2.0"),
        dev=DevConfig(tiny_world=True, world="smollm2", cache_dir=str(cache)),
    )


# The large recipes store features as fp8_topk (BENCHMARKS.md, "Storage"): fp8 aux states plus the
# target's top-256 next-token distribution instead of the final state, with lz4 on the state
# columns. Measured (BENCHMARKS.md, idle): 0.392 of 8*H per token at Kimi's H with lz4 and 0.319
# with zstd (fp8_all + zstd: 0.410, raw + zstd: 0.779); accept length 0.986 of raw features on the
# tiny world (goals <= 0.40, >= 0.98). lz4 because it also reads faster than the per-sample
# torch.save layout (1.14x at H 512, where the top-k column weighs as much as the aux states; fp8
# states with lz4 read 2.0-2.3x), while zstd reads 0.60x of it: at ~400 MB/s per core over ~23 KB
# per token that is about 17K tokens/s per core at Kimi's H, a rate one GPU rank's training step may
# outrun (not measured: no GPU here).
LARGE_FEATURES = {"encoding": "fp8_topk", "topk": 256, "hidden_compression": "lz4"}


def llama3_8b() -> PipelineConfig:
    """Llama-3.1-8B-Instruct target (32 layers, H 4096, vocab 128256) on one 8-GPU node; features in
    fp8_topk."""
    return PipelineConfig(
        name="llama3_8b",
        root=_run_root("llama3_8b"),
        target=TargetConfig(
            model_path="meta-llama/Llama-3.1-8B-Instruct",
            num_layers=32,
            hidden_size=4096,
            vocab_size=128_256,
            context_length=8192,
        ),
        sources=_hub_sources(),
        mix=MixConfig(total=100_000),
        capture=CaptureConfig(**LARGE_FEATURES),
        server=ServerLaunchConfig(engine="sglang"),
        gate=GateConfig(prompt_sets=_gate_sets()),
    )


# What the large recipes' capture needs from SGLang: its model runner with the target as served
# (packed INT4 or NVFP4 experts, tensor parallel over the node's GPUs), rank r on GPU r, and a
# capture task holding all of them.
SGLANG_CAPTURE = {"backend": "sglang", "device": "cuda", "gpus": 8}


def _served_moe(name: str, target: TargetConfig) -> PipelineConfig:
    """A large MoE target served and captured with SGLang on one 8-GPU node (tp 8, FSDP training
    over its 8 GPUs), the Hub mix and gate sets, features in fp8_topk, regen and the deciding gate
    profile at the vendors' served sampling: the Kimi-K2.5 and GLM-5 recipes, which differ only in
    target."""
    return PipelineConfig(
        name=name,
        root=_run_root(name),
        target=target,
        sources=_hub_sources(),
        mix=MixConfig(total=88_088),
        capture=CaptureConfig(**SGLANG_CAPTURE, **LARGE_FEATURES),
        regen=RegenConfig(**SERVED_REGEN),
        train=TrainConfig(nproc=8, parallel="fsdp"),
        server=ServerLaunchConfig(engine="sglang", tp=8),
        gate=GateConfig(prompt_sets=_gate_sets(), sampling=VENDOR_SAMPLING),
    )


def kimi_k2_5() -> PipelineConfig:
    """Kimi-K2.5 target (61 layers, H 7168, vocab 163840): the model this pipeline was built for,
    served with tp 8.

    A DeepSeek-V3-family target (``target.family=deepseek``: SGLang's layer-id rule for it,
    ``eagle3.config.pipeline``). Captured with ``capture.backend=sglang`` (``SGLANG_CAPTURE``):
    SGLang's model runner on the node's 8 GPUs, one rank each, the INT4 experts kept packed as
    SGLang serves them: ~74 GB of weights per GPU plus ~1 GB of capture buffers (``eagle3 config
    show`` prints the plan; capture refuses before loading when a GPU has less free). The ``hf``
    backend would decompress the checkpoint to ~2.1 TB of bf16 at its first forward, more than 8 x
    H200 hold (``eagle3.capture.footprint``). ``target.checkpoint_bytes`` is the plan's weights when
    the checkpoint's headers cannot be read (offline): 60 MoE layers x 384 experts x 3 x 7168 x 2048
    INT4 weights with a bf16 scale per 32 (4.5 bits each: 571 GB) plus ~12B bf16 parameters
    (attention, shared experts, embeddings: 24 GB), ~595 GB; the headers win whenever they are
    reachable. Features in fp8_topk (``LARGE_FEATURES``): ~3.0 TB per night as stored with lz4 (3.05
    TB before the codec; ``eagle3 config show`` prints the estimate) instead of ~5.9 TB of raw bf16
    states with zstd (7.58 TB before it).

    The draft is an MLA head with the full vocabulary (``KIMI_DRAFT``), the layout of the published
    Kimi-K2.5/K2.6 drafts (TorchSpec's ``kimi-k2.5-eagle3-mla``: the target's MLA sizes, q_lora_rank
    1536, kv_lora_rank 512, 128/64/128 head dims, YaRN factor 64, vocab 163840 without d2t) and what
    vLLM recommends for Kimi: its KV cache takes the target's MLA shape, and without a reduced vocab
    SGLang's rejection sampling serves it. On the tiny world MLA matches MHA at equal parameters
    (BENCHMARKS.md, "MLA vs MHA drafts"), so the published practice decides."""
    target = TargetConfig(
        model_path="moonshotai/Kimi-K2.5",
        family="deepseek",
        num_layers=61,
        hidden_size=7168,
        vocab_size=163_840,
        context_length=8192,
        trust_remote_code=True,
        checkpoint_bytes=595 * 10**9,
    )
    return with_overrides(_served_moe("kimi_k2_5", target), KIMI_DRAFT)


# The Kimi draft: MLA attention (eagle3.model.mla) over the full target vocab (no d2t).
KIMI_DRAFT = ["train.architecture.attention=mla", "vocab.draft_vocab_size=163840"]


def glm_5() -> PipelineConfig:
    """GLM-5 in NVFP4 (``nvidia/GLM-5-NVFP4``; 78 layers, H 6144, vocab 154880; 744B parameters, 40B
    active): served and captured with tp 8, its NVFP4 experts kept packed.

    The shape is GLM-5's published config (``GlmMoeDsaConfig``: 78 layers, the first 3 dense, 256
    routed experts of intermediate 2048 with top-8 routing and one shared expert, MLA with DeepSeek
    sparse attention); this repository has no other record of it and this machine cannot read the
    checkpoint. SGLang 0.5.23 serves it as ``GlmMoeDsaForCausalLM``, a ``DeepseekV2ForCausalLM``
    whose ``set_eagle3_layers_to_capture`` it inherits, hence ``target.family=deepseek`` (aux layers
    ``[2, 39, 75]``, exported as ``[1, 38, 74]``). ModelOpt's NVFP4 quantizes the routed experts
    only (4-bit values with an fp8 scale per 16: 4.5 bits): 75 x 256 x 3 x 6144 x 2048 expert
    weights, 408 GB, plus ~19B bf16 parameters, 38 GB: ``target.checkpoint_bytes`` ~446 GB, ~56 GB a
    GPU at tp 8. SGLang runs NVFP4 with FP4 kernels on Blackwell and, from compute capability 8.0
    (H200 included), through its Marlin FP4 weight-only path
    (``ModelOptFp4Config.get_min_capability`` is 80). Not run here (no GPU); the checks a node with
    SGLang must run are ``benchmarks/gpu_checks.sh``'s ``sglang-capture`` steps."""
    return _served_moe(
        "glm_5",
        TargetConfig(
            model_path="nvidia/GLM-5-NVFP4",
            family="deepseek",
            num_layers=78,
            hidden_size=6144,
            vocab_size=154_880,
            context_length=8192,
            checkpoint_bytes=446 * 10**9,
        ),
    )


RECIPES: dict[str, Callable[[], PipelineConfig]] = {
    "tiny": tiny,
    "tiny_think": tiny_think,
    "tiny_served": tiny_served,
    "tiny_served_mix": tiny_served_mix,
    "smollm2": smollm2,
    "llama3_8b": llama3_8b,
    "kimi_k2_5": kimi_k2_5,
    "glm_5": glm_5,
}


def load_recipe(name: str, overrides: list[str] | None = None) -> PipelineConfig:
    try:
        build = RECIPES[name]
    except KeyError:
        raise ConfigError(
            f"unknown recipe {name!r}; known recipes: {', '.join(sorted(RECIPES))}"
        ) from None
    config = build()
    return with_overrides(config, overrides) if overrides else config


def resolve(recipe_or_path: str | Path, overrides: list[str] | None = None) -> PipelineConfig:
    """The validated config of a recipe name or a YAML file, with ``a.b=value`` overrides applied.

    A ``Path`` is always a file; a string is a file when it ends in ``.yaml``/``.yml`` or names an
    existing file, else a recipe name. The CLI, the pipeline flow's first task and ``python -m
    eagle3.regen`` all come through here, so every door reads a config the same way; every problem
    (a missing file, bad YAML, an unknown recipe or key, a bad value) is a ``ConfigError`` whose
    message names the fix.
    """
    text = str(recipe_or_path)
    path = Path(text).expanduser()
    if (
        isinstance(recipe_or_path, str)
        and not text.endswith((".yaml", ".yml"))
        and not path.is_file()
    ):
        return check_inputs(load_recipe(text, overrides))
    if not path.is_file():
        raise ConfigError(
            f"config file {path} does not exist (pass a YAML file or a recipe: {', '.join(RECIPES)})"
        )
    try:
        return check_inputs(load_yaml(path, overrides))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from None


def check_inputs(config: PipelineConfig) -> PipelineConfig:
    """``config``, once what it names on disk fits it: each local gate prompt set has rows of a
    known shape (``eagle3.data.prompt_sets``), the target's checkpoint has ``target.num_layers``
    layers. Files not there yet (a world the run's first task builds) are checked where they are
    read."""
    from eagle3.data.prompt_sets import PromptSetError, check_prompt_set

    check_target_layers(config)
    for name, where in sorted(config.gate.prompt_sets.items()):
        if not where.startswith("hub:"):
            try:
                check_prompt_set(where, name)
            except PromptSetError as exc:
                raise ConfigError(str(exc)) from None
    return config


class ConfigRef(BaseModel):
    """A config by reference (a recipe name or a YAML path, plus overrides), resolved where it is
    used.

    Deployments store this, not a resolved config: a worker resolves it at run time, so an upgrade,
    a changed ``EAGLE3_HOME`` or an edited YAML file takes effect on the next run, and no absolute
    run root is frozen into the deployment at apply time."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    recipe: str = "tiny"
    overrides: list[str] = Field(default_factory=list)

    def resolve(self) -> PipelineConfig:
        return resolve(self.recipe, self.overrides)
