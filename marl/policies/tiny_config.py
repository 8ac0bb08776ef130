"""Shape of the built-in tiny transformer, and its presets (no torch import here, so that
scenario validation stays light)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

import yaml

from marl.errors import MarlError
from marl.tokenizer import CharTokenizer

PRESET_DIR = Path(__file__).resolve().parents[2] / "configs" / "model"


@dataclass(frozen=True)
class TinyConfig:
    """Model shape. Defaults are the ``tiny`` preset (about 0.42M parameters)."""

    vocab_size: int = CharTokenizer().vocab_size
    """Token ids, including the special ones."""
    n_layer: int = 2
    """Transformer blocks."""
    n_head: int = 4
    """Attention heads per block."""
    n_embd: int = 128
    """Width of the residual stream."""
    mlp_ratio: int = 4
    """MLP hidden width as a multiple of n_embd (unless mlp_hidden is set)."""
    mlp_hidden: int | None = None
    """MLP hidden width; default mlp_ratio * n_embd."""
    mlp: str = "gelu"
    """gelu: down(gelu(up x)); swiglu: down(silu(gate x) * up x), as in Llama."""
    rope_base: float = 10000.0
    """Base of the rotary position frequencies."""
    norm_eps: float | None = None
    """RMSNorm epsilon; None: torch's default for the dtype."""
    tie_embeddings: bool = False
    """Share the input embedding with the output projection."""
    embed_std: float = 0.02
    """Standard deviation of the token embeddings at initialisation (GPT-2's 0.02)."""

    @property
    def hidden(self) -> int:
        return self.mlp_hidden or self.mlp_ratio * self.n_embd

    def __post_init__(self) -> None:
        if self.n_embd % self.n_head or (self.n_embd // self.n_head) % 2:
            raise MarlError(f"n_embd={self.n_embd} must split into n_head={self.n_head} heads "
                            "of even width; choose e.g. n_embd=64, n_head=4.")
        if not self.embed_std > 0:
            raise MarlError(f"embed_std={self.embed_std} must be > 0 (zero would give every "
                            "token the same embedding); GPT-2's 0.02 is the default.")
        if self.mlp not in ("gelu", "swiglu"):
            raise MarlError(f"mlp={self.mlp!r}: choose 'gelu' or 'swiglu'.")

    @classmethod
    def from_preset(cls, preset: str) -> TinyConfig:
        """A preset name (``configs/model/NAME.yaml``) or a path to such a YAML file."""
        path = Path(preset) if preset.endswith((".yaml", ".yml")) else PRESET_DIR / f"{preset}.yaml"
        if not path.is_file():
            names = sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))
            raise MarlError(f"unknown model preset {preset!r}: {path} does not exist. "
                            f"Presets: {', '.join(names)}; or give a path to a YAML file.")
        overrides = yaml.safe_load(path.read_text()) or {}
        valid = {f.name for f in fields(cls)}
        if unknown := sorted(set(overrides) - valid):
            raise MarlError(f"{path}: unknown key(s) {unknown}; valid keys: {sorted(valid)}.")
        return cls(**overrides)
