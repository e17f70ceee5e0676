"""``python -m eagle3.capture.sglang.worker --rank R --out-dir DIR -- <SGLang server flags>``: one
tensor-parallel rank of SGLang's model runner, doing capture forwards for the capture process
(``eagle3.capture.sglang.backend``, which starts one per rank in SGLang's interpreter). Every SGLang
symbol the capture backend uses is in this module.

How it drives SGLang 0.5.23 (the steps of SGLang's own one-batch benchmark,
``sglang.benchmark.one_batch``, whose loader and helpers it calls, so the runner is set up exactly
as SGLang sets up a scheduler's):
- ``prepare_server_args`` parses the flags a server of this target takes
  (``eagle3.capture.sglang.backend. worker_args``): its quantization, ``--tp-size``/``--ep-size``,
  dtype, and ``--enable-return-aux-hidden-states
  --speculative-algorithm EAGLE3 --return-aux-hidden-state-layer-ids ...``, SGLang's capture-only
  EAGLE-3 mode: the target captures its aux states with ``set_eagle3_layers_to_capture`` (the
  draft's ids, mapped by the target family's rule as when it serves a draft), no draft loads, and
  the logits processor keeps every token's post-norm final state
  (``LogitsProcessorOutput.last_hidden_states``) next to the aux concatenation (``hidden_states``).
- each batch is one prefill-only extend ``ScheduleBatch`` (no prefix cache: a tree cache that shares
  nothing), forwarded with ``CaptureHiddenMode.FULL``; the request and KV pools are cleared after
  it, so no sample ever reads another's KV. A batch with more samples than the request pool holds is
  forwarded in slices.
- for ``fp8_topk`` each rank turns the final states into logits over its shard of the vocab-parallel
  ``lm_head`` (``quant_method.apply``, as SGLang's logits processor does), keeps its shard's top-k
  and log-sum-exp, and the ranks all-gather those: the top-k of the union of the shards' top-k is
  the global top-k, and ``exp(logit - logsumexp over every shard)`` is its full-vocab softmax.
  Nothing of ``[T, V]`` crosses between ranks.
Rank 0 writes each batch's tensors into a shared-memory file (``eagle3.capture.sglang.channel``);
every rank answers every message, so the capture process sees a failure on any rank.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

import torch

from eagle3.capture.sglang.channel import send, write_tensors

logger = logging.getLogger(__name__)
TOPK_CHUNK = 2048  # tokens per logits chunk: [chunk, V / tp] float32 at a time


class Runner:
    """SGLang's model runner for one rank, loaded from server flags (module docstring)."""

    def __init__(self, sglang_args: list[str], *, rank: int) -> None:
        from sglang.benchmark.one_batch import _init_process_global_configs, load_model
        from sglang.srt.entrypoints.engine import _set_envs_and_config
        from sglang.srt.runtime_context import SpawnRanks, publish, spawn_world_rank
        from sglang.srt.server_args import PortArgs, prepare_server_args

        server_args = prepare_server_args(sglang_args)
        server_args.resolve_once()
        _set_envs_and_config(server_args)
        world_rank = spawn_world_rank(server_args, tp_rank=rank, pp_rank=0)
        publish(server_args, role="scheduler", ranks=SpawnRanks(world_rank=world_rank, gpu_id=rank))
        _init_process_global_configs()
        bench_runner, _tokenizer = load_model(
            server_args, PortArgs.init_new(server_args), rank, rank
        )
        self.model_runner = bench_runner.torch_runner
        self.tp_size = server_args.tp_size

    def facts(self) -> dict[str, Any]:
        """What the capture process checks before the first batch: the layers SGLang captures
        (``input_of_layer``), the hidden size, and the pools' capacity (tokens of KV, requests)."""
        model = self.model_runner.model
        layers = next(
            (m.layers_to_capture for m in model.modules() if hasattr(m, "layers_to_capture")), None
        )
        return {
            "layers": list(layers or []),
            "hidden_size": int(self.model_runner.model_config.hidden_size),
            "max_tokens": int(self.model_runner.max_total_num_tokens),
            "max_requests": int(self.model_runner.req_to_token_pool.size),
            "tp_size": self.tp_size,
        }

    @torch.inference_mode()
    def capture(self, batch_ids: list[list[int]], *, topk: int | None) -> dict[str, torch.Tensor]:
        """``aux [T, 3H]`` and ``last [T, H]`` (or ``ids``/``probs [T, k]``) of the batch, samples
        concatenated."""
        # requests the pool holds (its padding slot 0 not counted)
        size = self.model_runner.req_to_token_pool.size
        parts = [self._extend(batch_ids[i : i + size]) for i in range(0, len(batch_ids), size)]
        aux = torch.cat([p[0] for p in parts])
        last = torch.cat([p[1] for p in parts])
        if topk is None:
            return {"aux": aux, "last": last}
        ids, probs = self._topk(last, topk)
        return {"aux": aux, "ids": ids.to(torch.int32), "probs": probs}

    def _extend(self, batch_ids: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        from sglang.benchmark.one_batch import TreeCacheNamespace, _maybe_prepare_mlp_sync_batch
        from sglang.srt.managers.schedule_batch import ScheduleBatch
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch
        from sglang.srt.runtime_context import get_schedule
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        runner = self.model_runner
        reqs = [_request(i, ids) for i, ids in enumerate(batch_ids)]
        no_prefix = TreeCacheNamespace(
            page_size=get_schedule().page_size,
            device=runner.device,
            token_to_kv_pool_allocator=runner.token_to_kv_pool_allocator,
        )
        batch = ScheduleBatch.init_new(
            reqs=reqs,
            req_to_token_pool=runner.req_to_token_pool,
            token_to_kv_pool_allocator=runner.token_to_kv_pool_allocator,
            tree_cache=no_prefix,
            model_config=runner.model_config,
            enable_overlap=False,
            spec_algorithm=SpeculativeAlgorithm.NONE,
        )
        try:
            batch.prepare_for_extend()
            _maybe_prepare_mlp_sync_batch(batch, runner)
            if (
                batch.input_ids is None
                and getattr(batch, "prefill_input_ids_cpu", None) is not None
            ):
                batch.input_ids = batch.prefill_input_ids_cpu.to(batch.device, non_blocking=True)
                batch.prefill_input_ids_cpu = None
            forward = ForwardBatch.init_new(
                batch,
                runner,
                capture_hidden_mode=CaptureHiddenMode.FULL,
                return_hidden_states_before_norm=False,
            )
            out = runner.forward(forward).logits_output
        finally:
            runner.req_to_token_pool.clear()
            runner.token_to_kv_pool_allocator.clear()
        if out.hidden_states is None or out.last_hidden_states is None:
            raise RuntimeError(
                "SGLang returned no aux or final states: the runner was not started in its capture-only "
                "EAGLE-3 mode (--enable-return-aux-hidden-states --speculative-algorithm EAGLE3)"
            )
        return out.hidden_states, out.last_hidden_states

    def _lm_head(self) -> torch.nn.Module:
        heads = [
            m
            for name, m in self.model_runner.model.named_modules()
            if name.split(".")[-1] == "lm_head"
        ]
        if len(heads) != 1:
            raise RuntimeError(
                f"expected one lm_head in {type(self.model_runner.model).__name__}, found {len(heads)}"
            )
        return heads[0]

    def _topk(self, last: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Full-vocab top-``k`` ids (int64) and softmax probabilities (float32) of each token's next
        token."""
        from sglang.srt.distributed import tensor_model_parallel_all_gather

        head = self._lm_head()
        start = head.shard_indices.org_vocab_start_index
        # this rank's real vocab rows (no padding)
        rows = head.shard_indices.org_vocab_end_index - start
        ids, probs = [], []
        for chunk in last.split(TOPK_CHUNK):
            # [n, H] -> [n, V/tp]
            logits = head.quant_method.apply(head, chunk, None)[:, :rows].float()
            lse = torch.logsumexp(logits, dim=-1, keepdim=True)  # [n, 1]
            values, index = logits.topk(min(k, rows), dim=-1)  # [n, k]
            index = index + start
            if self.tp_size > 1:  # [n, k] -> [n, tp * k]; [n, 1] -> [n, tp]
                values, index, lse = (
                    tensor_model_parallel_all_gather(t.contiguous(), dim=-1)
                    for t in (values, index, lse)
                )
            top = values.topk(k, dim=-1)
            ids.append(index.gather(-1, top.indices))
            probs.append(torch.exp(top.values - torch.logsumexp(lse, dim=-1, keepdim=True)))
        return torch.cat(ids), torch.cat(probs)


def _request(i: int, ids: list[int]) -> Any:
    """One prefill-only request (SGLang's ``Req``): its whole input is extended, no logprobs, no
    decode."""
    from array import array

    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    req = Req(
        rid=str(i),
        origin_input_text="",
        origin_input_ids=array("q", ids),
        sampling_params=SamplingParams(temperature=0, max_new_tokens=1),
    )
    req.full_untruncated_fill_ids = req.origin_input_ids
    req.logprob_start_len = -1
    req.extend_end = len(req.origin_input_ids)
    return req


def serve(
    runner: Runner, requests: Iterable[str], replies: IO[str], *, rank: int, out_dir: Path
) -> None:
    """Answer ``forward`` messages until ``close`` or the end of ``requests`` (the capture process
    is gone). A failed batch is answered with its error (the capture process then stops every rank),
    never left unanswered."""
    for line in requests:
        message = json.loads(line)
        if message.get("op") == "close":
            return
        try:
            tensors = runner.capture(message["ids"], topk=message.get("topk"))
            reply: dict[str, Any] = {"done": message["batch"]}
            if rank == 0:
                path = out_dir / f"batch-{message['batch']:08d}.bin"
                reply |= {"file": str(path), "layout": write_tensors(path, tensors)}
        # the process boundary: the capture process raises it with this rank's log
        except Exception as exc:
            logger.exception("capture batch %s failed on rank %d", message.get("batch"), rank)
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        send(replies, reply)


def _reply_stream() -> IO[str]:
    """The control pipe is this process's stdout as started; from here on anything printed (SGLang
    prints) goes to stderr, the rank's log."""
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    return replies


def main(argv: list[str]) -> None:
    if "--" not in argv:
        raise SystemExit(
            "usage: python -m eagle3.capture.sglang.worker --rank R --out-dir DIR -- <SGLang flags>"
        )
    cut = argv.index("--")
    own, sglang_args = dict(zip(argv[:cut:2], argv[1:cut:2], strict=True)), argv[cut + 1 :]
    replies = _reply_stream()
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s] %(message)s")
    if os.environ.get("SGLANG_USE_CPU_ENGINE") == "1":
        from eagle3.serve.sglang_cpu.shim import install

        install()
    rank = int(own["--rank"])
    try:
        runner = Runner(sglang_args, rank=rank)
    except Exception as exc:  # reported, then the traceback in the log
        send(replies, {"error": f"loading the target failed: {type(exc).__name__}: {exc}"})
        raise
    send(replies, {"ready": True, **runner.facts()})
    serve(runner, sys.stdin, replies, rank=rank, out_dir=Path(own["--out-dir"]))


if __name__ == "__main__":
    main(sys.argv[1:])
