"""Learning benchmark (docs/DESIGN.md, "What the benchmarks measure"): accept length of the trained
tiny draft / the untrained draft on held-out prompts, measured side by side in one run with the
reference speculative decoder (goal >= 1.5), plus CPU training throughput (tokens/s) and the
``last_hidden_only`` misconfiguration's accept length for contrast.

    python benchmarks/learning.py [--quick] [--model-dir DIR] [--encodings
    raw,fp8_aux,fp8_all,fp8_topk] [--topk 256]
                                  [--backends hf,sglang]

``--encodings`` trains one draft per feature encoding (``capture.encoding``) on the same batches
passed through that encoding's round trip (bf16 for ``raw``, as captured by default; the loader's
exact decode for fp8; for ``fp8_topk`` the top ``--topk`` of the target's ``lm_head`` over the bf16
final state, stored as int32 + float16, as capture and the loader do) and reports each one's accept
length relative to ``raw`` (goal >= 0.98), its final loss and its uncompressed bytes per token
relative to 8*H (``benchmarks/storage.py`` measures the compressed size).

``--backends hf,sglang`` trains one draft per capture backend (``capture.backend``) on the same
sequences in the same batches, captured by that backend in float32 (``hf``: transformers, as every
other row of this benchmark; ``sglang``: SGLang's model runner through ``eagle3.capture.sglang``,
the CPU runtime of ``infra/dev.sh sglang``), and reports each one's accept length on the held-out
prompts relative to ``hf`` (goal >= 0.98).

``--model-dir`` defaults to the tiny world's target (built or reused under ``EAGLE3_HOME``).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from eagle3.capture.encoding import TopKCodec, bytes_per_token, column_codecs, dequantize
from eagle3.capture.head import target_topk
from eagle3.config.capture import CaptureConfig
from eagle3.config.pipeline import PipelineConfig, with_overrides
from eagle3.config.target import TargetConfig
from eagle3.data.template import render_prompt
from eagle3.gate.offline_accept import evaluate_acceptance
from eagle3.serve.reference.spec_decoder import SpeculativeDecoder
from eagle3.train.checkpoint import save_checkpoint
from eagle3.train.distributed import DistInfo
from eagle3.train.export import export_draft
from eagle3.train.identity import load_inputs
from eagle3.train.trainer import build_draft, train_on_source
from eagle3.worlds.conversations import generate_conversations
from eagle3.worlds.distil import (
    ListBatchSource,
    answer_sequences,
    batches_from_target,
    greedy_answers,
    write_draft_vocab,
)


def _default_model_dir() -> Path:
    from eagle3.recipes import world_cache
    from eagle3.worlds.world import TinyWorldSpec, build_tiny_world

    world, _ = build_tiny_world(world_cache(), TinyWorldSpec())
    return Path(world.model_dir)


def as_stored(
    batches: list[dict], encoding: str, *, lm_head: torch.Tensor, topk: int
) -> list[dict]:
    """The batches a trainer would read back from features captured in bf16 with ``encoding``."""

    def round_trip(x: torch.Tensor, codec) -> torch.Tensor:
        x = x.bfloat16()
        if not codec.fp8:
            return x.float()
        values, scales = codec.views(pa.array([codec.encode(x.flatten(0, 1))], pa.binary()))[0]
        return dequantize(values, scales, torch.float32).view_as(x)

    def stored_topk(b: dict, codec: TopKCodec) -> dict:
        last = b["last_hidden"].bfloat16()
        ids, probs = target_topk(last.flatten(0, 1), lm_head, codec.k)
        ids, probs = codec.views(pa.array([codec.encode(ids, probs)], pa.binary()))[0]
        shape = (*last.shape[:2], codec.k)
        rest = {k: v for k, v in b.items() if k != "last_hidden"}
        return {
            **rest,
            "target_ids": ids.long().view(shape),
            "target_probs": probs.float().view(shape),
        }

    aux_codec, last_codec = column_codecs(
        encoding, "bfloat16", batches[0]["last_hidden"].shape[-1], topk=topk
    )
    out = []
    for b in batches:
        b = {**b, "aux_hidden": round_trip(b["aux_hidden"], aux_codec)}
        out.append(
            stored_topk(b, last_codec)
            if isinstance(last_codec, TopKCodec)
            else {**b, "last_hidden": round_trip(b["last_hidden"], last_codec)}
        )
    return out


def run(
    model_dir: Path,
    *,
    train_prompts: int,
    held_out: int,
    epochs: int,
    max_new: int,
    encodings: tuple[str, ...] = (),
    topk: int = CaptureConfig().topk,
    backends: tuple[str, ...] = (),
) -> dict:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    target = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    eos = tokenizer.eos_token_id
    convs = generate_conversations(train_prompts + held_out, seed=123)
    prompts = [render_prompt(tokenizer, [next(m for m in c if m["role"] == "user")]) for c in convs]
    answers = greedy_answers(
        target,
        prompts[:train_prompts],
        max_new_tokens=max_new,
        eos_id=eos,
        pad_id=tokenizer.pad_token_id,
    )
    sequences = answer_sequences(prompts[:train_prompts], answers)
    work = Path(tempfile.mkdtemp(prefix="eagle3-learning-"))
    hf = target.config
    config = with_overrides(
        PipelineConfig(
            name="learning",
            root=str(work),
            target=TargetConfig(
                model_path=str(model_dir),
                num_layers=hf.num_hidden_layers,
                hidden_size=hf.hidden_size,
                vocab_size=hf.vocab_size,
                context_length=1024,
                dtype="float32",
            ),
        ),
        [
            "train.precision=fp32",
            "train.device=cpu",
            "train.lr=3e-3",
            "train.batch_size=4",
            f"train.epochs={epochs}",
            "train.log_every=5",
            "train.save_every=100000",
            "speculative.num_steps=3",
            "speculative.num_draft_tokens=4",
        ],
    )
    write_draft_vocab(
        sequences,
        vocab_size=hf.vocab_size,
        draft_vocab_size=min(512, hf.vocab_size),
        path=work / "vocab.safetensors",
    )
    batches = batches_from_target(
        target, sequences, layer_ids=config.sglang_layer_ids, batch_size=4
    )
    inputs = load_inputs(config, work / "vocab.safetensors")
    cpu = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    started = time.monotonic()
    summary = train_on_source(config, ListBatchSource(batches), inputs, work / "trained", cpu)
    train_s = time.monotonic() - started
    save_checkpoint(
        work / "untrained" / "ckpt",
        0,
        model=build_draft(inputs, 0).state_dict(),
        optimizer={},
        trainer={"draft_config": inputs.draft_config.to_dict()},
        rank_state={},
    )
    held = prompts[train_prompts:]
    result = {
        "train_prompts": train_prompts,
        "held_out": held_out,
        "steps": summary["steps"],
        "train_s": round(train_s, 1),
        "train_tokens_per_s": round(summary["tokens_per_s"], 1),
        "final_loss": summary["final_loss"],
        "simulated_accept": summary["accept_length_sim"],
    }
    for name, mode in (
        ("trained", "eagle3"),
        ("untrained", "eagle3"),
        ("trained", "last_hidden_only"),
    ):
        export = work / f"export-{name}"
        if not export.exists():
            export_draft(config, work / name, work / "vocab.safetensors", None, export)
        decoder = SpeculativeDecoder(target, tokenizer, export, config.speculative.num_steps, mode)
        stats = evaluate_acceptance(decoder, held, max_new_tokens=max_new, eos_ids=[eos])
        result[f"accept_{name}_{mode}"] = round(stats["accept_length"], 3)
    result["ratio_trained_over_untrained"] = round(
        result["accept_trained_eagle3"] / result["accept_untrained_eagle3"], 3
    )
    if encodings:
        result["encodings"] = compare_encodings(
            config,
            target,
            tokenizer,
            inputs,
            batches,
            held,
            encodings,
            work=work,
            max_new=max_new,
            eos=eos,
            topk=topk,
        )
    if backends:
        result["backends"] = compare_backends(
            config,
            target,
            tokenizer,
            inputs,
            sequences,
            held,
            backends,
            work=work,
            max_new=max_new,
            eos=eos,
        )
    return result


def batches_from_backend(
    backend, sequences: list[tuple[list[int], list[int]]], *, batch_size: int
) -> list[dict]:
    """``batches_from_target``'s batches (same padding, same grouping), the states from a capture
    backend."""
    batches = []
    for start in range(0, len(sequences), batch_size):
        chunk = sequences[start : start + batch_size]
        width, h = max(len(ids) for ids, _ in chunk), backend.hidden_size
        batch = {
            "input_ids": torch.zeros(len(chunk), width, dtype=torch.long),
            "loss_mask": torch.zeros(len(chunk), width),
            "attention_mask": torch.zeros(len(chunk), width, dtype=torch.bool),
            "aux_hidden": torch.zeros(len(chunk), width, 3 * h),
            "last_hidden": torch.zeros(len(chunk), width, h),
        }
        for row, ((ids, loss), (aux, last)) in enumerate(
            zip(chunk, backend.forward([i for i, _ in chunk]), strict=True)
        ):
            n = len(ids)
            batch["input_ids"][row, :n], batch["loss_mask"][row, :n] = (
                torch.tensor(ids),
                torch.tensor(loss).float(),
            )
            batch["attention_mask"][row, :n] = True
            batch["aux_hidden"][row, :n], batch["last_hidden"][row, :n] = aux.float(), last.float()
        batches.append(batch)
    return batches


def compare_backends(
    config: PipelineConfig,
    target,
    tokenizer,
    inputs,
    sequences,
    held: list[str],
    backends: tuple[str, ...],
    *,
    work: Path,
    max_new: int,
    eos: int,
) -> dict:
    """Per capture backend: accept length of a draft trained on its features, relative to ``hf``."""
    from eagle3.capture.hf import HFBackend
    from eagle3.capture.sglang.backend import SGLangBackend

    cpu = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    out = {}
    for name in backends:
        captured = with_overrides(
            config,
            [
                f"capture.backend={name}",
                "capture.dtype=float32",
                # the target's context (2048) holds it
                "capture.max_seq_len=1024",
            ],
        )
        backend = (
            HFBackend(target, config.sglang_layer_ids) if name == "hf" else SGLangBackend(captured)
        )
        try:
            started = time.monotonic()
            batches = batches_from_backend(backend, sequences, batch_size=4)
            capture_s = time.monotonic() - started
        finally:
            if name == "sglang":
                backend.close()
        summary = train_on_source(
            config, ListBatchSource(batches), inputs, work / f"backend-{name}", cpu
        )
        export_draft(
            config,
            work / f"backend-{name}",
            work / "vocab.safetensors",
            None,
            work / f"export-bk-{name}",
        )
        decoder = SpeculativeDecoder(
            target, tokenizer, work / f"export-bk-{name}", config.speculative.num_steps, "eagle3"
        )
        stats = evaluate_acceptance(decoder, held, max_new_tokens=max_new, eos_ids=[eos])
        out[name] = {
            "accept": round(stats["accept_length"], 3),
            "final_loss": summary["final_loss"],
            "capture_s": round(capture_s, 1),
        }
    base = out.get("hf", {}).get("accept")
    for row in out.values():
        row["accept_over_hf"] = round(row["accept"] / base, 3) if base else None
    return out


def compare_encodings(
    config: PipelineConfig,
    target,
    tokenizer,
    inputs,
    batches: list[dict],
    held: list[str],
    encodings: tuple[str, ...],
    *,
    work: Path,
    max_new: int,
    eos: int,
    topk: int,
) -> dict:
    """Per encoding: accept length of a draft trained on that encoding's round trip, relative to
    ``raw``."""
    cpu = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    h, out = config.target.hidden_size, {}
    for encoding in encodings:
        stored = as_stored(batches, encoding, lm_head=inputs.head.lm_head, topk=topk)
        summary = train_on_source(
            config, ListBatchSource(stored), inputs, work / f"enc-{encoding}", cpu
        )
        export_draft(
            config,
            work / f"enc-{encoding}",
            work / "vocab.safetensors",
            None,
            work / f"export-{encoding}",
        )
        decoder = SpeculativeDecoder(
            target, tokenizer, work / f"export-{encoding}", config.speculative.num_steps, "eagle3"
        )
        stats = evaluate_acceptance(decoder, held, max_new_tokens=max_new, eos_ids=[eos])
        out[encoding] = {
            "accept": round(stats["accept_length"], 3),
            "final_loss": summary["final_loss"],
            "bytes_per_token_over_8H": round(
                bytes_per_token(encoding, "bfloat16", h, topk=topk) / (8 * h), 3
            ),
        }
    base = out.get("raw", {}).get("accept")
    for row in out.values():
        row["accept_over_raw"] = round(row["accept"] / base, 3) if base else None
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="small run (< 1 min on an idle 2-core machine)"
    )
    parser.add_argument(
        "--model-dir", type=Path, default=None, help="HF target dir (default: the tiny world's)"
    )
    parser.add_argument(
        "--encodings", default="", help="comma-separated capture.encoding values to compare"
    )
    parser.add_argument(
        "--topk", type=int, default=CaptureConfig().topk, help="k of fp8_topk (capture.topk)"
    )
    parser.add_argument(
        "--backends",
        default="",
        help="comma-separated capture.backend values to compare (hf,sglang)",
    )
    args = parser.parse_args()
    torch.set_num_threads(2)
    sizes = (
        dict(train_prompts=48, held_out=12, epochs=3, max_new=32)
        if args.quick
        else dict(train_prompts=192, held_out=32, epochs=4, max_new=48)
    )
    encodings = tuple(e for e in args.encodings.split(",") if e)
    backends = tuple(b for b in args.backends.split(",") if b)
    result = run(
        args.model_dir or _default_model_dir(),
        **sizes,
        encodings=encodings,
        topk=args.topk,
        backends=backends,
    )
    print(json.dumps(result, indent=2))
    print(
        f"accept length trained/untrained = {result['ratio_trained_over_untrained']:.2f} (goal >= 1.5); "
        f"CPU training {result['train_tokens_per_s']:.0f} tokens/s"
    )


if __name__ == "__main__":
    main()
