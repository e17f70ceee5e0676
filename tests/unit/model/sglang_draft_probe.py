"""``<SGLang runtime python> sglang_draft_probe.py EXPORT_DIR INPUTS OUT``: SGLang 0.5.23's own
``LlamaForCausalLMEagle3`` built from an export's ``config.json``, loaded by its ``load_weights`` from the export's
``model.safetensors`` (SGLang's safetensors iterator, as its model loader feeds it), run one draft step on the
inputs, and written back for the test (``test_export_sglang_eagle31.py``) to compare with our forward.

Every parameter starts as NaN, so one that no exported tensor reached stays NaN; the probe reports each parameter's
name, size and whether it is finite. The attention kernel is the one piece replaced: SGLang's ``RadixAttention``
reads a paged KV cache that only a scheduler sets up, so each layer's ``attn`` is a causal softmax attention over
the step's own tokens (one sequence). Everything else (the 3.1 norms, ``fc``, ``hidden_norm``, ``qkv_proj``, RoPE,
the MLP, ``norm``, ``norm_output`` and ``lm_head``) is SGLang's code. Runs in SGLang's interpreter only.
"""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace

os.environ["SGLANG_USE_CPU_ENGINE"] = "1"

from eagle3.serve.sglang_cpu.shim import install  # before any SGLang import

install()

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

FLAGS = ["--device", "cpu", "--attention-backend", "intel_amx", "--disable-cuda-graph", "--dtype", "float32",
         "--max-total-tokens", "1024", "--skip-tokenizer-init"]


def _runtime(export_dir: str):
    """SGLang's server args, parallel and layer runtime for the export as a model (one rank), and its config."""
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.distributed import bootstrap
    from sglang.srt.entrypoints.engine import _set_envs_and_config
    from sglang.srt.runtime_context import SpawnRanks, publish, spawn_world_rank
    from sglang.srt.server_args import PortArgs, prepare_server_args

    args = prepare_server_args(["--model-path", export_dir, *FLAGS])
    args.resolve_once()
    _set_envs_and_config(args)
    publish(args, role="scheduler", ranks=SpawnRanks(world_rank=spawn_world_rank(args, tp_rank=0, pp_rank=0),
                                                     gpu_id=0))
    config = ModelConfig.from_server_args(args)
    bootstrap.init_parallel_runtime(server_args=args, device="cpu", dist_port=PortArgs.init_new(args).nccl_port)
    bootstrap.init_layer_runtime(model_config=config)
    return config.hf_config


class CausalAttention(torch.nn.Module):
    """``RadixAttention``'s call ``(q, k, v, forward_batch)`` over one sequence ``[T, heads * D]``, causal."""

    def __init__(self, heads: int, kv_heads: int, head_dim: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim

    def forward(self, q, k, v, forward_batch, **_):
        t = q.shape[0]
        q = q.view(t, self.heads, self.head_dim).transpose(0, 1)  # [h, T, D]
        k = k.view(t, self.kv_heads, self.head_dim).transpose(0, 1).repeat_interleave(self.heads // self.kv_heads, 0)
        v = v.view(t, self.kv_heads, self.head_dim).transpose(0, 1).repeat_interleave(self.heads // self.kv_heads, 0)
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return out.transpose(0, 1).reshape(t, -1)


def main(export_dir: str, inputs_path: str, out_path: str) -> None:
    from sglang.srt.model_loader.weight_utils import safetensors_weights_iterator
    from sglang.srt.models.llama_eagle3 import LlamaForCausalLMEagle3

    hf_config = _runtime(export_dir)
    model = LlamaForCausalLMEagle3(hf_config)
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(float("nan"))
    model.load_weights(safetensors_weights_iterator([os.path.join(export_dir, "model.safetensors")]))
    for layer in model.model.layers:
        attn = layer.self_attn
        layer.self_attn.attn = CausalAttention(attn.num_heads, attn.num_kv_heads, attn.head_dim)
    inputs = load_file(inputs_path)
    batch = SimpleNamespace(spec_info=SimpleNamespace(hidden_states=inputs["hidden"]))
    with torch.no_grad():
        to_logits, aux = model.model(None, inputs["positions"], batch, input_embeds=inputs["embeds"])
        rows = hf_config.draft_vocab_size  # ParallelLMHead pads its rows; the padding is never a draft token
        logits = to_logits @ model.lm_head.weight[:rows].T  # LogitsProcessor's matmul on one rank
    report = {f"finite/{n}": torch.tensor(bool(p.isfinite().all())) for n, p in model.named_parameters()}
    report |= {f"numel/{n}": torch.tensor(p[:rows].numel() if n == "lm_head.weight" else p.numel())
               for n, p in model.named_parameters()}
    save_file({"logits": logits.contiguous(), "next_hidden": aux[0].contiguous(),
               "hot_token_id": model.get_hot_token_id(), **report}, out_path)


if __name__ == "__main__":
    main(*sys.argv[1:4])
