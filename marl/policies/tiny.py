"""The built-in ``tiny`` backend: a small causal transformer over the character tokenizer.

Pre-norm blocks (RMSNorm, multi-head attention with rotary position embeddings, a GELU or
SwiGLU MLP), input and output embeddings untied unless ``tie_embeddings``, a static KV cache
for generation. Positions come from the
left-padded attention mask, so a padded prompt gives the same logits as an unpadded one.
Presets live in ``configs/model/*.yaml`` as overrides of :class:`TinyConfig`'s defaults
(the defaults are the ``tiny`` preset). Weights are saved as safetensors plus config.json.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from marl.errors import MarlError
from marl.io import atomic_dir
from marl.policies.kv_reuse import Reuse
from marl.policies.tiny_config import TinyConfig


def _rotary(pos: torch.Tensor, dim: int, base: float,
            dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotary angles ``pos (B, T) * freq``, shaped ``(B, 1, T, dim/2)``."""
    freq = base ** (-torch.arange(0, dim, 2, device=pos.device, dtype=torch.float32) / dim)
    ang = pos[:, None, :, None].float() * freq
    return ang.cos().to(dtype), ang.sin().to(dtype)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate channel pairs ``(i, i + D/2)`` of ``x (B, H, T, D)`` by the precomputed angles
    (the "rotate half" layout: contiguous halves are cheaper than interleaved pairs)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class Block(nn.Module):
    def __init__(self, cfg: TinyConfig):
        super().__init__()
        self.cfg = cfg
        self.norm1 = nn.RMSNorm(cfg.n_embd, eps=cfg.norm_eps)
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=False)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=False)
        self.norm2 = nn.RMSNorm(cfg.n_embd, eps=cfg.norm_eps)
        # swiglu: gate and up in one matmul (Llama's gate_proj / up_proj, stacked)
        width = 2 * cfg.hidden if cfg.mlp == "swiglu" else cfg.hidden
        self.up = nn.Linear(cfg.n_embd, width, bias=False)
        self.down = nn.Linear(cfg.hidden, cfg.n_embd, bias=False)

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        if self.cfg.mlp == "gelu":
            return self.down(F.gelu(self.up(x)))
        gate, up = self.up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)

    def forward(self, x: torch.Tensor, rot: tuple[torch.Tensor, torch.Tensor], attn: torch.Tensor,
                cache: tuple[torch.Tensor, torch.Tensor] | None, start: int) -> torch.Tensor:
        b, t, c = x.shape
        h = self.cfg.n_head
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, h, c // h).permute(2, 0, 3, 1, 4)
        q, k = _rope(q, *rot), _rope(k, *rot)
        if cache is not None:  # write this step's keys/values, attend over everything so far
            kc, vc = cache
            kc[:, :, start : start + t], vc[:, :, start : start + t] = k, v
            k, v = kc[:, :, : start + t], vc[:, :, : start + t]
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn)  # (B, H, T, D)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.norm2(x))


class TinyLM(nn.Module):
    """A small causal language model; ``forward`` returns logits ``(B, T, V)``."""

    def __init__(self, cfg: TinyConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.norm = nn.RMSNorm(cfg.n_embd, eps=cfg.norm_eps)
        self.head = None if cfg.tie_embeddings else nn.Linear(cfg.n_embd, cfg.vocab_size,
                                                              bias=False)
        self.apply(lambda m: self._init(m, cfg.embed_std))
        for block in self.blocks:  # GPT-2 style: shrink residual projections with depth
            for lin in (block.proj, block.down):
                nn.init.normal_(lin.weight, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init(m: nn.Module, embed_std: float) -> None:
        if isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=embed_std)
        elif isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=0.02)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor, *,
                key_mask: torch.Tensor | None = None,
                cache: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
                start: int = 0) -> torch.Tensor:
        """``ids (B, T)`` at cache columns ``start..start+T``; ``key_mask (B, start+T)`` marks
        real tokens among all keys (default: ``mask``)."""
        key_mask = mask if key_mask is None else key_mask
        t, s = ids.shape[1], key_mask.shape[1]
        pos = (key_mask.long().cumsum(-1) - 1).clamp(min=0)[:, s - t :]
        causal = torch.ones(t, s, dtype=torch.bool, device=ids.device).tril(s - t)
        attn = causal[None] & key_mask[:, None, :]
        # A padding query would see no key at all; let it see itself (its output is unused).
        attn[:, torch.arange(t), torch.arange(s - t, s)] = True
        x = self.embed(ids)
        rot = _rotary(pos, self.cfg.n_embd // self.cfg.n_head, self.cfg.rope_base, x.dtype)
        for i, block in enumerate(self.blocks):
            x = block(x, rot, attn[:, None], cache[i] if cache is not None else None, start)
        x = self.norm(x)
        return self.head(x) if self.head is not None else x @ self.embed.weight.T

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


class TinyCausalLM:
    """:class:`TinyLM` behind the :class:`~marl.policies.generation.CausalLM` protocol."""

    def __init__(self, model: TinyLM, device: str | torch.device = "cpu"):
        self.model = model.to(device)
        self.device = torch.device(device)

    def weights(self) -> list[torch.nn.Parameter]:
        """The parameters that train (all of them), in a fixed order."""
        return list(self.model.parameters())

    def frozen(self) -> TinyCausalLM:
        """A copy of the current weights that does not train (the KL term's reference)."""
        return TinyCausalLM(copy.deepcopy(self.model).requires_grad_(False), self.device)

    def _empty(self, rows: int, columns: int, fill: Callable[..., torch.Tensor]) -> list:
        """Per layer, key and value buffers ``(rows, H, columns, D)`` made by ``fill``."""
        cfg = self.model.cfg
        shape = (rows, cfg.n_head, columns, cfg.n_embd // cfg.n_head)
        dtype = self.model.embed.weight.dtype
        return [(fill(shape, device=self.device, dtype=dtype),
                 fill(shape, device=self.device, dtype=dtype)) for _ in range(cfg.n_layer)]

    def prefill(self, ids: torch.Tensor, mask: torch.Tensor, max_new_tokens: int):
        b, p = ids.shape
        cache = self._empty(b, p + max_new_tokens, torch.empty)
        logits = self.model(ids, mask, cache=cache, start=0)
        return logits[:, -1], (cache, p)

    def gather(self, reuse: Reuse, room: int) -> Any:
        out = self._empty(len(reuse.length), reuse.width + room, torch.zeros)
        for layer, pair in enumerate(out):
            for kind, buf in enumerate(pair):
                reuse.take([kv[layer][kind] for kv, _ in reuse.caches], buf)
        return out, reuse.width

    def expand(self, cache: Any, index: torch.Tensor) -> Any:
        kv, used = cache
        return [(k[index], v[index]) for k, v in kv], used

    def decode(self, ids: torch.Tensor, mask: torch.Tensor, cache: Any):
        logits, cache = self.extend(ids, mask, cache)
        return logits[:, -1], cache

    def prefix(self, ids: torch.Tensor, mask: torch.Tensor, room: int):
        # Writes into the static cache are in-place copies, which autograd differentiates.
        return self.prefill(ids, mask, room)

    def extend(self, ids: torch.Tensor, mask: torch.Tensor, cache: Any):
        kv, used = cache
        logits = self.model(ids, ids.new_ones(ids.shape, dtype=torch.bool), key_mask=mask,
                            cache=kv, start=used)
        return logits, (kv, used + ids.shape[1])

    def logits(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.model(ids, mask)


def save_tiny(model: TinyLM, path: str | Path) -> Path:
    """Write ``config.json`` and ``model.safetensors`` into ``path`` atomically."""
    from safetensors.torch import save_file

    def write(tmp: Path) -> None:
        (tmp / "config.json").write_text(json.dumps({"backend": "tiny", **asdict(model.cfg)},
                                                    indent=2))
        state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
        save_file(state, tmp / "model.safetensors")

    return atomic_dir(path, write)


def load_tiny(path: str | Path) -> TinyLM:
    """Load a model written by :func:`save_tiny`."""
    from safetensors.torch import load_file

    path = Path(path)
    cfg_file, weights = path / "config.json", path / "model.safetensors"
    if not cfg_file.is_file() or not weights.is_file():
        raise MarlError(f"{path} is not a tiny-model checkpoint: it needs config.json and "
                        "model.safetensors (written by `marl train` or save_tiny).")
    raw = json.loads(cfg_file.read_text())
    raw.pop("backend", None)
    model = TinyLM(TinyConfig(**raw))
    model.load_state_dict(load_file(weights))
    return model
