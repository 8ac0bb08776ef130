import pytest
import torch


@pytest.fixture(scope="module")
def one_thread():
    """Tensors here are tiny: extra intra-op threads only wait on each other, and on a
    busy 2-core machine that turns milliseconds into seconds."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


#: tiny; hf sampling on the fast Llama twin (static cache); hf on transformers alone
#: (DynamicCache).
BACKENDS = ["tiny", "hf", "hf-slow"]


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """A tiny random Llama checkpoint with its char tokenizer, written to disk."""
    pytest.importorskip("transformers")
    from marl.policies.hf_local import build_tiny_hf

    return build_tiny_hf(tmp_path_factory.mktemp("hf") / "model")


def backend_lm(backend: str, request: pytest.FixtureRequest):
    """One of :data:`BACKENDS`: its CausalLM, trainable module and tokenizer (the tiny
    model drawn with torch seed 0)."""
    if backend == "tiny":
        from marl.policies.tiny import TinyCausalLM, TinyConfig, TinyLM
        from marl.tokenizer import CharTokenizer

        torch.manual_seed(0)
        model = TinyLM(TinyConfig())
        return TinyCausalLM(model), model, CharTokenizer()
    from marl.policies.hf import load_hf

    lm, tok = load_hf(request.getfixturevalue("hf_dir"), fast=backend == "hf")
    return lm, lm.model, tok
