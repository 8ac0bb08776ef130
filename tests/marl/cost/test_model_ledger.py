"""The ledger of a model policy counts exactly the ids its model reads and writes: the whole
input (BOS, chat template) on every call, every generated id (stop and end-of-sequence
tokens included), and as cached the prefix the call shares with the agent's previous call;
and the cost model predicts the BOS or template share of every prompt."""

import pytest
import yaml

from marl.cost.predict import predict_team
from marl.rollout import collect
from marl.runner import build_policies
from marl.team import load_team
from marl.tokenizer import common_prefix
from tests.marl.conftest import ROOT


@pytest.fixture(scope="module", params=["tiny", "hf", "hf-chat", "hf-chat-turns"])
def team(request, tmp_path_factory):
    """relay_ring (four rounds: every agent's prompt grows over its calls) played by tiny
    models, or by a local HF Llama without and with a chat template (the whole transcript
    as one user turn, or ``prompt_format: chat``: a turn per round)."""
    data = yaml.safe_load((ROOT / "scenarios" / "relay_ring.yaml").read_text())
    if request.param != "tiny":
        pytest.importorskip("transformers")
        from marl.policies.hf_local import build_tiny_hf

        path = build_tiny_hf(tmp_path_factory.mktemp("hf") / "llama", hidden_size=64,
                             num_heads=2, chat_template=request.param.startswith("hf-chat"))
        data["policies"]["default"].update(backend="hf", path=str(path), max_new_tokens=12)
        if request.param == "hf-chat-turns":
            data["policies"]["default"]["prompt_format"] = "chat"
    return load_team(data)


def test_every_call_is_counted_in_the_models_own_ids(team):
    batch = collect(team, build_policies(team), episodes=3, group_size=2, seed=0)
    rows = {(r.episode, r.agent, r.round): r for r in batch.rows}
    cached = 0
    for b in range(len(batch.records)):
        before: dict[str, list[int]] = {}  # agent -> its previous call's input and output
        for k in range(len(batch.call_agent)):  # call slots in the order they are played
            agent = team.ids[int(batch.call_agent[k])]
            row = rows[(b, agent, int(batch.call_round[k]))]
            read, wrote = list(batch.prompt_ids[b][k]), int(batch.mask[b, k].sum())
            assert row.prompt_tokens == len(read)
            assert row.completion_tokens == wrote > 0
            assert row.cached_tokens == common_prefix(before.get(agent, []), read)
            before[agent] = read + batch.tokens[b, k, :wrote].tolist()
            cached += row.cached_tokens
    assert cached > 0


def test_the_cost_model_predicts_the_model_inputs_share(team):
    """A first call reads nothing but its header (and the query): predicted exactly, the
    BOS or chat template included; later calls read what the agents wrote, and are bounded
    by the prediction with every message at max_new_tokens."""
    batch = collect(team, build_policies(team), episodes=2, seed=0)
    pred = predict_team(team)
    for row in batch.rows:
        if row.round == 0:
            assert row.prompt_tokens == pred.per_call[(row.agent, 0)].prompt
        assert row.prompt_tokens <= pred.per_call[(row.agent, row.round)].prompt
    text_only = predict_team(team, model_input=False).per_call[("r0", 0)].prompt
    assert pred.per_call[("r0", 0)].prompt > text_only  # a BOS token, or the template
