"""One base model, many agents: every LoRA policy of a team that names the same checkpoint
(with the same dtype and device) is an adapter on one shared copy of its weights.

The base is loaded once per team build (:class:`Bases`, made by
:func:`marl.runner.build_policies`) and wrapped in a peft ``PeftModel``; each policy adds
its own adapter (named after the policy) and makes it active before each forward
(:meth:`SharedBase.activate`). A policy's KL reference is a frozen twin adapter beside
its own (``<name>-ref``, a copy of the adapter's weights), never a copy of the base: at
the start, before any update, it is the base itself (LoRA's B matrices are zero).
Checkpoints hold each adapter on its own (:func:`save_adapter`), in peft's format, and
load back as adapters on the shared base, which the adapter's config names.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from marl.errors import MarlError
from marl.io import atomic_dir


@dataclass
class SharedBase:
    """A loaded checkpoint and the adapters on it."""

    model: Any  # a peft PeftModel over the transformers model
    path: Path  # the base checkpoint directory
    trainable: set[str] = field(default_factory=set)  # adapters that train (not references)
    engine: Any = None  # a vLLM engine on this base, shared by its vllm policies' adapters

    def weights(self, adapter: str) -> list[torch.nn.Parameter]:
        """The adapter's parameters, in a fixed order."""
        tag = f".{adapter}."
        return [p for n, p in self.model.named_parameters() if tag in n]

    def activate(self, adapter: str) -> None:
        """Make ``adapter`` the one every forward uses. peft's ``set_adapter`` freezes the
        other adapters; every trainable adapter is given its gradients back (only the
        active one takes part in a forward, so the others get none)."""
        if self.model.active_adapter == adapter:
            return
        self.model.set_adapter(adapter)
        for name in self.trainable:
            for p in self.weights(name):
                p.requires_grad_(True)
        if adapter not in self.trainable:  # a frozen reference stays frozen
            for p in self.weights(adapter):
                p.requires_grad_(False)

    def snapshot(self, adapter: str) -> str:
        """A frozen copy of ``adapter``'s current weights beside it (made once, refreshed
        on every call): the KL term's reference. Returns its name."""
        ref = f"{adapter}-ref"
        if ref not in self.model.peft_config:
            with _quiet():
                self.model.add_adapter(ref, self.model.peft_config[adapter])
            self.model.set_adapter(self.model.active_adapter)  # add_adapter may change it
        with torch.no_grad():
            for p, q in zip(self.weights(ref), self.weights(adapter), strict=True):
                p.copy_(q)
                p.requires_grad_(False)
        return ref


#: A team build's loaded bases: (base path, dtype, device) -> the shared base.
Bases = dict[tuple[str, str, str], SharedBase]


def adapter_on_base(bases: Bases, name: str, path: Path, *, dtype: str, device: str,
                    lora: dict[str, Any] | None, seed: int) -> SharedBase:
    """The shared base that ``path`` names (a checkpoint, or a saved adapter whose config
    names its base), with the adapter ``name`` on it: loaded from ``path`` when it is an
    adapter, else fresh from ``lora``'s settings, drawn with ``seed``."""
    from marl.policies.hf import (
        DTYPES,
        _check_checkpoint,
        _device,
        _lora_settings,
        import_optional,
    )

    peft = import_optional("peft")
    transformers = import_optional("transformers")
    saved = _check_checkpoint(path)
    base = Path(json.loads((path / "adapter_config.json").read_text())
                ["base_model_name_or_path"]) if saved else path
    if saved:
        _check_checkpoint(base, what=f"base model of the LoRA adapter in {path}")
    key = (str(base.resolve()), dtype, device)
    settings = None if saved else _lora_settings(lora)
    config = None if saved else peft.LoraConfig(
        r=settings["r"], lora_alpha=settings["alpha"], lora_dropout=settings["dropout"],
        target_modules=settings["target_modules"], task_type="CAUSAL_LM")
    with _quiet(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)  # a fresh adapter's initial weights
        if key not in bases:
            try:
                model = transformers.AutoModelForCausalLM.from_pretrained(
                    base, dtype=DTYPES[dtype], local_files_only=True)
            except (OSError, ValueError, KeyError) as e:
                raise MarlError(f"cannot load the HF checkpoint in {base}: {e}") from e
            model = model.to(_device(device))
            wrapped = (peft.PeftModel.from_pretrained(model, path, adapter_name=name,
                                                      is_trainable=True) if saved
                       else peft.get_peft_model(model, config, adapter_name=name))
            bases[key] = SharedBase(wrapped.eval(), base)
        elif saved:
            bases[key].model.load_adapter(path, adapter_name=name, is_trainable=True)
        else:
            bases[key].model.add_adapter(name, config)
    shared = bases[key]
    shared.trainable.add(name)
    shared.activate(name)  # gives every trainable adapter its gradients back
    return shared


def save_adapter(shared: SharedBase, adapter: str, tokenizer: Any, path: Path) -> Path:
    """Write ``adapter`` alone, in peft's format (its weights and config, the base path
    recorded), with the tokenizer (unless None), atomically into ``path``: a directory
    that :func:`adapter_on_base` (and ``marl run --checkpoint``, and vLLM) loads back."""
    from marl.policies.hf import import_optional

    peft = import_optional("peft")
    state = peft.get_peft_model_state_dict(shared.model, adapter_name=adapter)
    config = shared.model.peft_config[adapter]

    def write(tmp: Path) -> None:
        from safetensors.torch import save_file

        save_file({k: v.detach().contiguous().cpu() for k, v in state.items()},
                  tmp / "adapter_model.safetensors")
        config.base_model_name_or_path = str(shared.path)
        config.save_pretrained(tmp)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)

    return atomic_dir(Path(path), write)


@contextmanager
def _quiet() -> Iterator[None]:
    """peft 0.21 still reads an attribute that transformers 5.x deprecates."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated",
                                FutureWarning)
        yield
