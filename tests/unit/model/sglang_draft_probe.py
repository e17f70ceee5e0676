"""``<SGLang runtime python> sglang_draft_probe.py EXPORT_DIR INPUTS OUT``: SGLang 0.5.23's own
``LlamaForCausalLMEagle3`` (or, for an MLA export, ``Eagle3DeepseekV2ForCausalLM``) built from an
export's ``config.json``, loaded by its ``load_weights`` from the export's ``model.safetensors``
(SGLang's safetensors iterator, as its model loader feeds it), run one draft step on the inputs, and
written back for the tests (``test_export_sglang_eagle31.py``, ``test_export_sglang_mla.py``) to
compare with our forward.

Every parameter starts as NaN, so one that no exported tensor reached stays NaN; the probe reports
each parameter's name, size and whether it is finite. The attention kernel is the one piece
replaced: SGLang's ``RadixAttention`` reads a paged KV cache that only a scheduler sets up, so each
layer's ``attn`` is a causal softmax attention over the step's own tokens (one sequence). Everything
else (the 3.1 norms, ``fc``, ``hidden_norm``, ``qkv_proj``, RoPE, the MLP, ``norm``, ``norm_output``
and ``lm_head``) is SGLang's code. Runs in SGLang's interpreter only.

The MLA draft: its attention runs SGLang's own MHA path of ``DeepseekV2AttentionMLA``
(``forward_normal_prepare``: the fused down-projection, both latent norms,
``q_b_proj``/``kv_b_proj``, the ``deepseek_yarn`` RoPE; ``forward_normal_core``: ``o_proj``) with
``attn_mha`` a causal softmax at SGLang's own softmax scale; only the KV-pool write and the backend
dispatch are stubbed (both need a scheduler's pools). The absorbed path a decode step takes reads
``w_kc``/``w_vc`` from SGLang's ``post_load_weights``: the probe also computes that attention from
them over the latent (``latent_gap``: its largest gap to the MHA path's output).
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

FLAGS = [
    "--device",
    "cpu",
    "--attention-backend",
    "intel_amx",
    "--disable-cuda-graph",
    "--dtype",
    "float32",
    "--max-total-tokens",
    "1024",
    "--skip-tokenizer-init",
]


def _runtime(export_dir: str):
    """SGLang's server args, parallel and layer runtime for the export as a model (one rank), and
    its config."""
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.distributed import bootstrap
    from sglang.srt.entrypoints.engine import _set_envs_and_config
    from sglang.srt.runtime_context import SpawnRanks, publish, spawn_world_rank
    from sglang.srt.server_args import PortArgs, prepare_server_args

    args = prepare_server_args(["--model-path", export_dir, *FLAGS])
    args.resolve_once()
    _set_envs_and_config(args)
    publish(
        args,
        role="scheduler",
        ranks=SpawnRanks(world_rank=spawn_world_rank(args, tp_rank=0, pp_rank=0), gpu_id=0),
    )
    config = ModelConfig.from_server_args(args)
    bootstrap.init_parallel_runtime(
        server_args=args, device="cpu", dist_port=PortArgs.init_new(args).nccl_port
    )
    bootstrap.init_layer_runtime(model_config=config)
    return config.hf_config


class CausalAttention(torch.nn.Module):
    """``RadixAttention``'s call ``(q, k, v, forward_batch)`` over one sequence ``[T, heads * D]``,
    causal; values may be ``v_dim`` wide and the softmax ``scale`` SGLang's (None: ``D^-0.5``)."""

    def __init__(
        self,
        heads: int,
        kv_heads: int,
        head_dim: int,
        v_dim: int | None = None,
        scale: float | None = None,
    ) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.v_dim, self.scale = v_dim or head_dim, scale

    def forward(self, q, k, v, forward_batch, **_):
        t, groups = q.shape[0], self.heads // self.kv_heads
        q = q.reshape(t, self.heads, self.head_dim).transpose(0, 1)  # [h, T, D]
        k = k.reshape(t, self.kv_heads, self.head_dim).transpose(0, 1).repeat_interleave(groups, 0)
        v = v.reshape(t, self.kv_heads, self.v_dim).transpose(0, 1).repeat_interleave(groups, 0)
        sdpa = torch.nn.functional.scaled_dot_product_attention
        out = sdpa(q, k, v, is_causal=True, scale=self.scale)
        return out.transpose(0, 1).reshape(t, -1)


def _latent_attention(attn, q, latent, positions) -> torch.Tensor:
    """The absorbed form of SGLang's MLA attention (what its decode path computes from the latent
    cache), from SGLang's own ``w_kc``/``w_vc``: per head, the no-rope query ``q_nope @ w_kc`` meets
    the normalised latent, the rope query meets the shared ``k_pe``; the latent values go out
    through ``w_vc``. ``[T, heads * v]``."""
    nope = attn.qk_nope_head_dim
    c = attn.kv_a_layernorm(latent[..., : attn.kv_lora_rank].contiguous())  # [T, kv_lora]
    k_pe = latent[:, None, attn.kv_lora_rank :].clone()
    q_pe, k_pe = attn.rotary_emb(positions, q[..., nope:].clone(), k_pe)
    q_latent = torch.einsum("thn,hnc->thc", q[..., :nope], attn.w_kc)  # w_kc [h, nope, kv_lora]
    scores = torch.einsum("thc,sc->hts", q_latent, c)
    scores = scores + torch.einsum("thr,sr->hts", q_pe, k_pe[:, 0])
    mask = torch.ones(q.shape[0], q.shape[0], dtype=torch.bool).tril()
    probs = (scores * attn.scaling).masked_fill(~mask, float("-inf")).softmax(-1)
    out = torch.einsum("hts,sc->thc", probs, c)  # [T, h, kv_lora]
    out = torch.einsum("thc,hcv->thv", out, attn.w_vc)  # w_vc [h, kv_lora, v]
    return out.reshape(q.shape[0], -1)


def _serve_mla_attention_by_its_mha_path(attn) -> dict:
    """SGLang's MHA path of ``attn`` with a causal ``attn_mha`` (module docstring); returns what it
    saw."""
    from sglang.srt.models.deepseek_common.attention_forward_methods import forward_methods

    AttnForwardMethod = forward_methods.AttnForwardMethod

    seen: dict = {}
    attn.attn_mha = CausalAttention(
        attn.num_local_heads,
        attn.num_local_heads,
        attn.qk_head_dim,
        attn.v_head_dim,
        scale=attn.scaling,
    )
    attn.attn_mha.kv_b_proj = None  # RadixAttention's slot, filled by forward_prepare
    attn.dispatch_attn_forward_method = lambda forward_batch: AttnForwardMethod.MHA
    attn._set_mla_kv_buffer = lambda *args: None  # the paged pool a scheduler owns
    prepare = attn.forward_normal_prepare

    def recording_prepare(positions, hidden_states, forward_batch, zero_allocator):
        from sglang.srt.layers.layer_boundary import get_attn_tp_context

        fused = get_attn_tp_context().fetch_qkv_latent()
        seen["q"] = attn.q_b_proj(attn.q_a_layernorm(fused[..., : attn.q_lora_rank]))[0].view(
            -1, attn.num_local_heads, attn.qk_head_dim
        )
        seen["latent"], seen["positions"] = fused[..., attn.q_lora_rank :], positions
        return prepare(positions, hidden_states, forward_batch, zero_allocator)

    attn.forward_normal_prepare = recording_prepare
    core = attn.forward_normal_core

    def recording_core(q, k, v, forward_batch, *args, **kwargs):
        seen["attn_out"] = attn.attn_mha(q, k, v, forward_batch)
        return core(q, k, v, forward_batch, *args, **kwargs)

    attn.forward_normal_core = recording_core
    return seen


def _model(hf_config):
    """SGLang's draft class for the export's architecture, and whether it is the MLA one."""
    if hf_config.architectures == ["Eagle3DeepseekV2ForCausalLM"]:
        from sglang.srt.models.kimi_k25_eagle3 import Eagle3DeepseekV2ForCausalLM

        return Eagle3DeepseekV2ForCausalLM(hf_config), True
    from sglang.srt.models.llama_eagle3 import LlamaForCausalLMEagle3

    return LlamaForCausalLMEagle3(hf_config), False


def main(export_dir: str, inputs_path: str, out_path: str) -> None:
    from sglang.srt.model_loader.weight_utils import safetensors_weights_iterator

    hf_config = _runtime(export_dir)
    model, mla = _model(hf_config)
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(float("nan"))
    model.load_weights(
        safetensors_weights_iterator([os.path.join(export_dir, "model.safetensors")])
    )
    if mla:
        seen = _serve_mla_attention_by_its_mha_path(model.model.midlayer.self_attn)
    for layer in [] if mla else model.model.layers:
        attn = layer.self_attn
        layer.self_attn.attn = CausalAttention(attn.num_heads, attn.num_kv_heads, attn.head_dim)
    inputs = load_file(inputs_path)
    spec_info = SimpleNamespace(hidden_states=inputs["hidden"])
    batch = SimpleNamespace(spec_info=spec_info, mha_one_shot=False)
    from sglang.srt.model_executor.forward_context import ForwardContext, forward_context

    # no paged backend: SGLang's attention reads only what the causal stand-ins above give it
    with torch.no_grad(), forward_context(ForwardContext(attn_backend=SimpleNamespace())):
        to_logits, aux = model.model(
            None, inputs["positions"], batch, input_embeds=inputs["embeds"]
        )
        # ParallelLMHead pads its rows; the padding is never a draft token
        rows = hf_config.draft_vocab_size
        logits = to_logits @ model.lm_head.weight[:rows].T  # LogitsProcessor's matmul on one rank
        extra = {}
        if mla:
            attn = model.model.midlayer.self_attn
            latent = _latent_attention(attn, seen["q"], seen["latent"], seen["positions"])
            extra["latent_gap"] = (latent - seen["attn_out"]).abs().max()
    report = {
        f"finite/{n}": torch.tensor(bool(p.isfinite().all())) for n, p in model.named_parameters()
    }
    report |= {
        f"numel/{n}": torch.tensor(p[:rows].numel() if n == "lm_head.weight" else p.numel())
        for n, p in model.named_parameters()
    }
    hot = model.get_hot_token_id()
    save_file(
        {
            "logits": logits.contiguous(),
            "next_hidden": aux[0].contiguous(),
            **extra,
            **report,
            **({} if hot is None else {"hot_token_id": hot}),
        },
        out_path,
    )


if __name__ == "__main__":
    main(*sys.argv[1:4])
