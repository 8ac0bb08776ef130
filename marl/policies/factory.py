"""Build model policies (``tiny``, ``hf``) from a scenario's policy spec."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from marl.errors import MarlError
from marl.policies import TeamBuild
from marl.policies.generation import Sampling
from marl.policies.lm import LMPolicy
from marl.policies.tiny import TinyCausalLM, TinyLM, load_tiny, save_tiny
from marl.policies.tiny_config import TinyConfig
from marl.scenario import PolicySpec
from marl.tasks import Task
from marl.tokenizer import CharTokenizer


def sampling_of(spec: PolicySpec) -> Sampling:
    return Sampling(temperature=spec.temperature, top_p=spec.top_p, top_k=spec.top_k,
                    max_new_tokens=spec.max_new_tokens, stop=tuple(spec.stop))


def sampling_seed(spec: PolicySpec, seed: int) -> int:
    """The policy's own ``seed`` when the scenario sets one (0 included), else the run's."""
    return seed if spec.seed is None else spec.seed


def build_tiny(spec: PolicySpec, task: Task, seed: int, checkpoint: Path | None,
               team: TeamBuild | None = None) -> LMPolicy:
    """A tiny transformer: from ``checkpoint`` (or ``spec.path``) if given, else freshly
    initialised from ``spec.preset`` with ``seed``."""
    source = checkpoint or (Path(spec.path) if spec.path else None)
    if source is not None:
        model = load_tiny(source)
    else:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = TinyLM(TinyConfig.from_preset(spec.preset))
    if spec.dtype != "float32":
        model = model.to(getattr(torch, spec.dtype))
    lm = TinyCausalLM(model, _device(spec.device))
    return LMPolicy(lm, CharTokenizer(), sampling_of(spec), seed=sampling_seed(spec, seed),
                    module=model, saver=lambda path: save_tiny(model, path))


def build_hf(spec: PolicySpec, task: Task, seed: int, checkpoint: Path | None,
             team: TeamBuild | None = None) -> LMPolicy:
    """A local Hugging Face checkpoint (``spec.path``; ``checkpoint``: trained weights). A
    LoRA policy (``lora``, or a saved adapter) is an adapter on the team's one copy of its
    base checkpoint (:mod:`marl.policies.shared`); any other loads a copy of its own."""
    from marl.policies.hf import load_hf, save_hf

    path = Path(checkpoint or spec.path)
    parts = lora_parts(spec, path, seed, team)
    if parts is not None:
        lm, tok, saver = parts
    else:
        lm, tok = load_hf(path, dtype=spec.dtype, device=spec.device, fast=spec.fast,
                          **chat_settings(spec))
        saver = lambda out: save_hf(lm, tok, out)  # noqa: E731
    return LMPolicy(lm, tok, sampling_of(spec), seed=sampling_seed(spec, seed), module=lm.model,
                    saver=saver)


def chat_settings(spec: PolicySpec) -> dict:
    """The tokenizer's prompt format settings of an ``hf`` or ``vllm`` policy."""
    return {"chat": spec.prompt_format == "chat", "template_kwargs": spec.chat_template_kwargs}


def lora_parts(spec: PolicySpec, path: Path, seed: int,
               team: TeamBuild | None) -> tuple[Any, Any, Callable[[Path], Path]] | None:
    """A LoRA policy's model (an adapter on the team's one copy of its base), tokenizer
    and saver (the adapter alone); None for a policy without ``lora`` or a saved adapter."""
    if spec.lora is None and not (path / "adapter_config.json").is_file():
        return None
    from marl.policies.hf import HFCausalLM, hf_tokenizer
    from marl.policies.shared import adapter_on_base, save_adapter

    team = team or TeamBuild()
    shared = adapter_on_base(team.bases, team.name, path, dtype=spec.dtype,
                             device=spec.device, lora=spec.lora, seed=seed)
    lm = HFCausalLM(shared.model, fast=False, shared=shared, adapter=team.name)
    tok = hf_tokenizer(path, **chat_settings(spec))
    return lm, tok, lambda out: save_adapter(shared, team.name, tok.tokenizer, out)


def _device(name: str) -> torch.device:
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise MarlError(f"device {name!r} was asked for but CUDA is not available here; "
                        "set the policy's device to 'cpu'.")
    return torch.device(name)
