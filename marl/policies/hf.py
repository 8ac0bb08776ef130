"""The ``hf`` backend's model side: any local ``AutoModelForCausalLM`` checkpoint.

:class:`HFCausalLM` adapts a transformers model to the
:class:`~marl.policies.generation.CausalLM` protocol (prefill, then one forward per token
against the model's own KV cache; no ``model.generate``), :class:`HFTokenizer` adapts its
tokenizer to :class:`~marl.tokenizer.Tokenizer`, and :func:`load_hf` / :func:`save_hf`
move both to and from a local directory, optionally with a LoRA adapter through peft.

Position ids come from the left-padded mask (a row's first real token is position 0), so
a padded prompt gives the same logits as the prompt alone. transformers and peft are
imported inside the functions that need them (extra ``llm-marl[hf]``).
"""

from __future__ import annotations

import copy
import importlib
import inspect
import json
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from marl.errors import MarlError
from marl.io import atomic_dir
from marl.policies.fast_llama import LlamaTwin, twin_config
from marl.policies.kv_reuse import Reuse
from marl.policies.tiny import TinyCausalLM
from marl.prompts import conversation

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from marl.policies.shared import SharedBase

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
LORA_DEFAULTS: dict[str, Any] = {"r": 8, "alpha": 16, "dropout": 0.0,
                                 "target_modules": "all-linear"}


def import_optional(module: str) -> Any:
    """Import a package of the ``hf`` extra, or fail naming the extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise MarlError(f"the hf backend needs the Python package {module!r}, which is not "
                        f"installed ({e}); pip install 'llm-marl[hf]'") from e


def _positions(mask: torch.Tensor) -> torch.Tensor:
    """``(B, T)`` bool mask -> position ids counting real tokens only (pads get 0)."""
    return (mask.long().cumsum(-1) - 1).clamp_(min=0)


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model under a peft wrapper (whose ``forward`` takes ``**kwargs``)."""
    try:
        from peft import PeftModel
    except ImportError:
        return model
    return model.get_base_model() if isinstance(model, PeftModel) else model


def _full_attention(config: Any) -> bool:
    """Whether every layer of a model attends to all earlier positions (no sliding
    window), so that its caches can be joined column for column."""
    kinds = getattr(config, "layer_types", None)
    if kinds:
        return all(k == "full_attention" for k in kinds)
    return config is not None and getattr(config, "sliding_window", None) is None


class HFCausalLM:
    """:class:`~marl.policies.generation.CausalLM` over a transformers causal LM.

    The cache is the model's own (a ``DynamicCache``, grown in place); ``max_new_tokens``
    needs no reservation.
    """

    def __init__(self, model: torch.nn.Module, fast: bool = True,
                 shared: SharedBase | None = None, adapter: str | None = None):
        self.model = model
        self.device = model.device
        # A LoRA adapter on a base that other policies share: made active before every
        # forward (marl.policies.shared).
        self.shared, self.adapter = shared, adapter
        # What trains, fixed now (a frozen copy made from this one keeps the same list).
        self._weights = (shared.weights(adapter) if shared is not None else
                         [p for p in model.parameters() if p.requires_grad])
        # Generation on the engine's own implementation when the architecture allows it
        # (see marl.policies.fast_llama); scoring always runs the transformers model.
        self.twin = _fast_twin(model) if fast and adapter is None else None
        # The twin behind the CausalLM protocol, built once (building moves it to a device).
        self._fast = TinyCausalLM(self.twin.model, self.device) if self.twin else None
        params = inspect.signature(_unwrap(model).forward).parameters
        # transformers 5.x renamed `past_key_values` to `cache` (inputs and outputs);
        # older models and remote code still take the old name.
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        # An adapter decodes in one batch with the other adapters on its base
        # (marl.policies.mixed) where every layer attends to every column.
        self.mixes = adapter is not None and _full_attention(getattr(model, "config", None))
        # Prefill needs only the last position's logits: skip the rest of the LM head.
        self._last_only = {"logits_to_keep": 1} if "logits_to_keep" in params else {}

    def _active(self) -> None:
        if self.shared is not None:
            self.shared.activate(self.adapter)

    def weights(self) -> list[torch.nn.Parameter]:
        """The parameters that train, in a fixed order: an adapter's, or the model's."""
        return self._weights

    def frozen(self) -> HFCausalLM:
        """A copy of the current weights that does not train (the KL term's reference): a
        frozen twin adapter on the shared base, or a copy of the whole model."""
        if self.shared is not None:
            return HFCausalLM(self.model, fast=False, shared=self.shared,
                              adapter=self.shared.snapshot(self.adapter))
        ref = HFCausalLM(copy.deepcopy(self.model), fast=False)
        ref.model.requires_grad_(False)
        return ref

    def prefill(self, ids: torch.Tensor, mask: torch.Tensor,
                max_new_tokens: int) -> tuple[torch.Tensor, Any]:
        self._active()
        if self.twin is not None:
            self.twin.current()  # re-synced if the weights changed
            return self._fast.prefill(ids, mask, max_new_tokens)
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=_positions(mask),
                         use_cache=True, return_dict=True, **self._last_only)
        return out.logits[:, -1], out[self._cache_kw]

    def expand(self, cache: Any, index: torch.Tensor) -> Any:
        # Sampling's caches come from the fast twin when there is one; scoring's (from
        # `prefix`) always from the transformers model.
        if not hasattr(cache, "reorder_cache"):
            return self._fast.expand(cache, index)
        cache.reorder_cache(index)  # index_select along the batch, in place
        return cache

    def decode(self, ids: torch.Tensor, mask: torch.Tensor,
               cache: Any) -> tuple[torch.Tensor, Any]:
        if self.twin is not None:
            return self._fast.decode(ids, mask, cache)
        self._active()
        pos = _positions(mask)[:, -ids.shape[1]:]
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos,
                         use_cache=True, return_dict=True, **{self._cache_kw: cache},
                         **self._last_only)
        return out.logits[:, -1], out[self._cache_kw]

    def take(self, cache: Any, index: torch.Tensor) -> Any:
        """A new cache of rows ``index`` of ``cache`` (a transformers ``DynamicCache``)."""
        from transformers.cache_utils import DynamicCache

        return DynamicCache([(layer.keys.index_select(0, index),
                              layer.values.index_select(0, index)) for layer in cache.layers])

    def join(self, caches: list[Any], pads: list[int]) -> Any:
        """One cache of the rows of ``caches``, each left-padded by its ``pads`` columns
        (masked out: their keys and values are zeros)."""
        from torch.nn.functional import pad as padded
        from transformers.cache_utils import DynamicCache

        layers = []
        for i in range(len(caches[0].layers)):
            layers.append(tuple(torch.cat([padded(getattr(c.layers[i], kind), (0, 0, n, 0))
                                           for c, n in zip(caches, pads, strict=True)])
                                for kind in ("keys", "values")))
        return DynamicCache(layers)

    def decode_mixed(self, ids: torch.Tensor, mask: torch.Tensor, cache: Any,
                     adapters: list[str]) -> tuple[torch.Tensor, Any]:
        """:meth:`decode` with each row through its own adapter on the shared base."""
        pos = _positions(mask)[:, -ids.shape[1]:]
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos,
                         use_cache=True, return_dict=True, adapter_names=adapters,
                         **{self._cache_kw: cache}, **self._last_only)
        return out.logits[:, -1], out[self._cache_kw]

    def gather(self, reuse: Reuse, room: int) -> Any | None:
        # As in `expand`: the twin's caches (sampling) or the transformers model's (scoring).
        if self.twin is not None and not hasattr(reuse.caches[0], "layers"):
            self.twin.current()  # the decode that follows runs the current weights
            return self._fast.gather(reuse, room)
        from transformers.cache_utils import DynamicCache, DynamicLayer

        # Only full-attention layers keep every column (sliding windows drop old ones).
        if not all(isinstance(c, DynamicCache) and all(type(x) is DynamicLayer
                                                       for x in c.layers)
                   for c in reuse.caches):
            return None
        b = len(reuse.length)
        layers = []
        for i, first in enumerate(reuse.caches[0].layers):
            pair = []
            for kind in ("keys", "values"):
                like = getattr(first, kind)
                out = like.new_zeros((b, like.shape[1], reuse.width, like.shape[3]))
                pair.append(reuse.take([getattr(c.layers[i], kind) for c in reuse.caches], out))
            layers.append(tuple(pair))
        return DynamicCache(layers)

    def logits(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        self._active()
        return self.model(input_ids=ids, attention_mask=mask, position_ids=_positions(mask),
                          use_cache=False, return_dict=True).logits

    def prefix(self, ids: torch.Tensor, mask: torch.Tensor, room: int) -> tuple[torch.Tensor, Any]:
        self._active()
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=_positions(mask),
                         use_cache=True, return_dict=True, **self._last_only)
        return out.logits[:, -1], out[self._cache_kw]

    def extend(self, ids: torch.Tensor, mask: torch.Tensor,
               cache: Any) -> tuple[torch.Tensor, Any]:
        self._active()
        pos = _positions(mask)[:, -ids.shape[1]:]
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos,
                         use_cache=True, return_dict=True, **{self._cache_kw: cache})
        return out.logits, out[self._cache_kw]


class HFTokenizer:
    """:class:`~marl.tokenizer.Tokenizer` over a transformers (fast) tokenizer.

    ``encode`` adds no special tokens and ``decode`` drops them; prompts go through
    :meth:`encode_prompt`, which applies the chat template when there is one.
    """

    prefix_stable = False
    charset = None  # byte-level: any Unicode text

    def __init__(self, tokenizer: PreTrainedTokenizerBase, name: str | None = None,
                 chat: bool = False, template_kwargs: dict[str, Any] | None = None):
        if chat and not tokenizer.chat_template:
            raise MarlError(f"prompt_format: chat needs a chat template, and the tokenizer of "
                            f"{tokenizer.name_or_path} has none; use prompt_format: "
                            "transcript, or a chat model's checkpoint.")
        self.tokenizer = tokenizer
        self.chat = chat  # prompt_format: chat (marl.prompts.conversation)
        self.template_kwargs = template_kwargs or {}
        self.name = name or f"hf:{Path(tokenizer.name_or_path).name}"
        self.eos_id: int | None = tokenizer.eos_token_id
        self.bos_id: int | None = tokenizer.bos_token_id
        # Pads are masked out everywhere, so any id will do when there is no pad token.
        pad = tokenizer.pad_token_id
        self.pad_id: int = pad if pad is not None else self.eos_id or 0
        self.vocab_size = len(tokenizer)
        # Longest decoded token bounds how many characters a token limit allows.
        pieces = tokenizer.convert_ids_to_tokens(list(range(self.vocab_size)))
        self.max_token_chars = max(1, *(len(p) for p in pieces if p))
        self._memo: dict[str, tuple[int, ...]] = {}
        self._backend = _plain_backend(tokenizer)

    #: Texts whose ids are remembered: the environment counts the same prompts, histories
    #: and messages again and again (the G rollouts of an instance share their prompts).
    MEMO = 8192

    def encode(self, text: str) -> list[int]:
        ids = self._memo.get(text)
        if ids is None:
            ids = tuple(self._backend.encode(text, add_special_tokens=False).ids
                        if self._backend is not None
                        else self.tokenizer.encode(text, add_special_tokens=False))
            if len(self._memo) >= self.MEMO:
                self._memo.pop(next(iter(self._memo)))  # the oldest entry
            self._memo[text] = ids
        return list(ids)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True,
                                     clean_up_tokenization_spaces=False)

    def count(self, text: str) -> int:
        return len(self.encode(text))

    def render(self, observation: str) -> str:
        """The prompt text the model reads: the chat template applied to the conversation
        (``chat``: :func:`marl.prompts.conversation`) or to the whole transcript as one
        user turn, or without a template the observation after the BOS token (when the
        tokenizer has one)."""
        if self.tokenizer.chat_template:
            turns = (conversation(observation) if self.chat else
                     [{"role": "user", "content": observation}])
            return self.tokenizer.apply_chat_template(
                turns, add_generation_prompt=True, tokenize=False, **self.template_kwargs)
        return (self.tokenizer.bos_token or "") + observation

    def encode_prompt(self, observation: str) -> list[int]:
        if self.tokenizer.chat_template:
            return self.encode(self.render(observation))
        bos = [] if self.bos_id is None else [self.bos_id]
        return bos + self.encode(observation)


def _plain_backend(tokenizer: PreTrainedTokenizerBase) -> Any | None:
    """A fast tokenizer's Rust ``tokenizers.Tokenizer``, copied with truncation and padding
    off: ``encode(text, add_special_tokens=False).ids`` then gives what transformers'
    ``encode`` gives (which sets the same before calling it), ~10x faster. None for a
    slow (Python) tokenizer."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    backend = copy.deepcopy(backend)
    backend.no_truncation()
    backend.no_padding()
    return backend


def _fast_twin(model: torch.nn.Module) -> LlamaTwin | None:
    """A generation twin for plain Llama models without adapters; None otherwise."""
    if model is not _unwrap(model):  # LoRA deltas live outside the base weights
        return None
    cfg = twin_config(model.config)
    return LlamaTwin(model, cfg) if cfg is not None else None


def load_hf(path: str | Path, *, dtype: str = "float32", device: str | torch.device = "cpu",
            lora: dict[str, Any] | None = None, trust_remote_code: bool = False,
            fast: bool = True, chat: bool = False,
            template_kwargs: dict[str, Any] | None = None) -> tuple[HFCausalLM, HFTokenizer]:
    """Load a local checkpoint directory (never the Hub) as an adapter and a tokenizer.

    ``path`` holds either a full model (``config.json`` + weights) or a LoRA adapter saved
    by :func:`save_hf` (``adapter_config.json``, whose base model is loaded from its
    recorded local path). ``lora`` adds a fresh adapter: keys ``r``, ``alpha``, ``dropout``,
    ``target_modules`` (defaults in :data:`LORA_DEFAULTS`); then only its weights train.
    ``fast`` generates with the engine's own implementation of Llama-architecture models;
    ``chat`` and ``template_kwargs`` say how the tokenizer renders a prompt
    (:class:`HFTokenizer`).
    """
    path = Path(path)
    if dtype not in DTYPES:
        raise MarlError(f"dtype {dtype!r} is not supported for HF models; "
                        f"valid: {', '.join(DTYPES)}")
    settings = _lora_settings(lora)
    dev = _device(device)
    adapter = _check_checkpoint(path)
    if adapter and settings is not None:
        raise MarlError(f"{path} already holds a LoRA adapter (adapter_config.json), so "
                        "`lora` must not be given too; drop it to keep training that adapter")
    transformers = import_optional("transformers")
    base = path
    if adapter:
        base = Path(json.loads((path / "adapter_config.json").read_text())
                    ["base_model_name_or_path"])
        _check_checkpoint(base, what=f"base model of the LoRA adapter in {path}")
    opts = {"local_files_only": True, "trust_remote_code": trust_remote_code}
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            base, dtype=DTYPES[dtype], **opts)
        tokenizer = transformers.AutoTokenizer.from_pretrained(path, **opts)
    except (OSError, ValueError, KeyError) as e:
        raise MarlError(f"cannot load the HF checkpoint in {path}: {e}") from e
    if adapter or settings is not None:
        model = _attach_lora(model, path if adapter else None, settings)
    return (HFCausalLM(model.to(dev).eval(), fast=fast),
            HFTokenizer(tokenizer, chat=chat, template_kwargs=template_kwargs))


def hf_tokenizer(path: str | Path, trust_remote_code: bool = False, chat: bool = False,
                 template_kwargs: dict[str, Any] | None = None) -> HFTokenizer:
    """The tokenizer of a local checkpoint (or adapter) directory, without its weights."""
    transformers = import_optional("transformers")
    _check_checkpoint(Path(path))
    try:
        return HFTokenizer(transformers.AutoTokenizer.from_pretrained(
            path, local_files_only=True, trust_remote_code=trust_remote_code),
            chat=chat, template_kwargs=template_kwargs)
    except (OSError, ValueError, KeyError) as e:
        raise MarlError(f"cannot load the tokenizer of the HF checkpoint in {path}: {e}") from e


def save_hf(model: HFCausalLM, tokenizer: HFTokenizer, path: str | Path, *,
            merge: bool = False) -> Path:
    """Write model and tokenizer into ``path`` atomically (a temp dir beside it, renamed).

    A LoRA model saves only its adapter unless ``merge``, which writes a full checkpoint
    with the adapter folded in (the live model keeps its adapter). Either loads back with
    :func:`load_hf`.
    """
    net = model.model
    if merge and net is not _unwrap(net):
        net = copy.deepcopy(net).merge_and_unload()

    def write(tmp: Path) -> None:
        net.save_pretrained(tmp)
        tokenizer.tokenizer.save_pretrained(tmp)

    return atomic_dir(Path(path), write)


def _attach_lora(model: torch.nn.Module, adapter: Path | None,
                 settings: dict[str, Any] | None) -> torch.nn.Module:
    """Wrap ``model`` with the saved adapter in ``adapter`` or a fresh one from ``settings``."""
    peft = import_optional("peft")
    with warnings.catch_warnings():
        # peft 0.21 still reads an attribute that transformers 5.x deprecates.
        warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated",
                                FutureWarning)
        if adapter is not None:
            return peft.PeftModel.from_pretrained(model, adapter, is_trainable=True)
        return peft.get_peft_model(model, peft.LoraConfig(
            r=settings["r"], lora_alpha=settings["alpha"], lora_dropout=settings["dropout"],
            target_modules=settings["target_modules"], task_type="CAUSAL_LM"))


def _device(device: str | torch.device) -> torch.device:
    try:
        dev = torch.device(device)
    except RuntimeError as e:
        raise MarlError(f"device {device!r} is not a torch device ({e}); use e.g. 'cpu', "
                        "'cuda' or 'cuda:1'") from e
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise MarlError(f"device {device!r} asked for, but torch sees no CUDA GPU here; "
                        "use device='cpu'")
    return dev


def _lora_settings(lora: dict[str, Any] | None) -> dict[str, Any] | None:
    if lora is None:
        return None
    unknown = sorted(set(lora) - set(LORA_DEFAULTS))
    if unknown:
        raise MarlError(f"unknown LoRA setting(s) {', '.join(unknown)}; "
                        f"valid: {', '.join(LORA_DEFAULTS)}")
    return LORA_DEFAULTS | lora


def _check_checkpoint(path: Path, what: str = "HF checkpoint") -> bool:
    """Fail early, naming what is missing; returns whether ``path`` is a LoRA adapter."""
    if not path.is_dir():
        problem = "is a file, not a directory" if path.exists() else "does not exist"
        raise MarlError(f"{what} directory {path} {problem}; pass a local directory "
                        "holding config.json, the weights and the tokenizer (write one with "
                        "save_hf or marl.policies.hf_local.build_tiny_hf)")
    if (path / "config.json").is_file():
        return False
    if (path / "adapter_config.json").is_file():
        return True
    found = ", ".join(sorted(p.name for p in path.iterdir())[:10]) or "nothing"
    raise MarlError(f"{what} directory {path} has no config.json (found: {found}); it is not "
                    "a Hugging Face model directory (save_pretrained writes one)")
