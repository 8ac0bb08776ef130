"""A fast generation twin for Llama-architecture Hugging Face checkpoints.

transformers' modules spend most of a small model's decode step in Python (mask building,
cache bookkeeping, many tiny ops). For checkpoints whose architecture :class:`TinyLM` can
express exactly (Llama: RMSNorm, rotary embeddings in the rotate-half layout, SwiGLU MLP,
no biases, no rope scaling, as many key/value heads as query heads), the engine copies the
weights into a :class:`TinyLM` with a static KV cache and generates with that, the way
serving engines run their own model implementations. Training still differentiates
through the Hugging Face model; the twin re-copies the weights whenever they have changed
(tracked by the parameters' in-place version counters), so sampling always uses the
current policy.
"""

from __future__ import annotations

from typing import Any

import torch

from marl.policies.tiny import TinyLM
from marl.policies.tiny_config import TinyConfig


def twin_config(hf_config: Any) -> TinyConfig | None:
    """The :class:`TinyConfig` equivalent to a Llama config, or None if there is none."""
    c = hf_config
    heads = c.num_attention_heads
    # transformers 5 keeps rope settings in rope_parameters (4.x: rope_theta, rope_scaling)
    rope = getattr(c, "rope_parameters", None) or getattr(c, "rope_scaling", None) or {}
    plain = (
        c.model_type == "llama" and rope.get("rope_type", "default") == "default"
        and set(rope) <= {"rope_theta", "rope_type"}
        and getattr(c, "num_key_value_heads", heads) == heads
        and not getattr(c, "attention_bias", False) and not getattr(c, "mlp_bias", False)
        and c.hidden_act == "silu"
        and getattr(c, "head_dim", c.hidden_size // heads) == c.hidden_size // heads
    )
    if not plain:
        return None
    theta = rope.get("rope_theta") or getattr(c, "rope_theta", None) or 10000.0
    return TinyConfig(vocab_size=c.vocab_size, n_layer=c.num_hidden_layers, n_head=heads,
                      n_embd=c.hidden_size, mlp_hidden=c.intermediate_size, mlp="swiglu",
                      rope_base=float(theta), norm_eps=c.rms_norm_eps,
                      tie_embeddings=bool(c.tie_word_embeddings))


@torch.no_grad()
def copy_weights(hf_model: torch.nn.Module, twin: TinyLM) -> None:
    """Copy a Llama model's weights into its twin (same dtype and device)."""
    m = hf_model.model
    twin.embed.weight.copy_(m.embed_tokens.weight)
    for block, layer in zip(twin.blocks, m.layers, strict=True):
        a, f = layer.self_attn, layer.mlp
        block.norm1.weight.copy_(layer.input_layernorm.weight)
        block.qkv.weight.copy_(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]))
        block.proj.weight.copy_(a.o_proj.weight)
        block.norm2.weight.copy_(layer.post_attention_layernorm.weight)
        block.up.weight.copy_(torch.cat([f.gate_proj.weight, f.up_proj.weight]))
        block.down.weight.copy_(f.down_proj.weight)
    twin.norm.weight.copy_(m.norm.weight)
    if twin.head is not None:
        twin.head.weight.copy_(hf_model.lm_head.weight)


class LlamaTwin:
    """Keeps a :class:`TinyLM` in step with a Llama model's current weights."""

    def __init__(self, hf_model: torch.nn.Module, cfg: TinyConfig):
        self.hf_model = hf_model
        ref = next(hf_model.parameters())
        self.model = TinyLM(cfg).to(device=ref.device, dtype=ref.dtype).eval()
        self.model.requires_grad_(False)
        self._version = -1

    def current(self) -> TinyLM:
        """The twin, re-synced first if any Hugging Face parameter changed in place."""
        version = sum(p._version for p in self.hf_model.parameters())
        if version != self._version:
            copy_weights(self.hf_model, self.model)
            self._version = version
        return self.model
