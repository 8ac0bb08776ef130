"""How much of each prompt a chat model's KV cache reuses across an agent's turns, with the
whole transcript as one user turn (``prompt_format: transcript``) or as a chat
(``prompt_format: chat``: system, a user turn per round, assistant turns).

    python benchmarks/chat_reuse.py [--scenario relay_ring.yaml] [--episodes 64]

One process, one locally built HF Llama with a chat template (the test builder's minimal
one), every policy of the scenario on it; the same seed for both formats. Per format:
prompt tokens the ledger counted (the model's input), positions the model prefilled,
prompt tokens taken from a stored cache, and the wall time of the ``collect``. A chat
template that closes each turn differently from how the model's own message ended (here
the stop token versus the template's newline) keeps the previous call's prefix only up to
that message: the measured reuse says how much that costs.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
import yaml

from marl.policies.hf_local import build_tiny_hf
from marl.rollout import collect
from marl.runner import build_policies
from marl.team import load_team

ROOT = Path(__file__).resolve().parents[1]


def measure(scenario: str, model: Path, fmt: str, episodes: int) -> dict[str, float]:
    data = yaml.safe_load((ROOT / "scenarios" / scenario).read_text())
    for spec in data["policies"].values():
        spec.update(backend="hf", path=str(model), prompt_format=fmt, max_new_tokens=8)
    team = load_team(data)
    policies = build_policies(team)
    collect(team, policies, episodes=2, seed=1)  # warm-up
    made = list(dict.fromkeys(policies.values()))
    before = [(p.prefill_tokens, p.reused_tokens) for p in made]
    start = time.perf_counter()
    batch = collect(team, policies, episodes=episodes, seed=0)
    wall = time.perf_counter() - start
    prefilled = sum(p.prefill_tokens - b[0] for p, b in zip(made, before, strict=True))
    reused = sum(p.reused_tokens - b[1] for p, b in zip(made, before, strict=True))
    prompt = sum(r.prompt_tokens for r in batch.rows)
    return {"prompt": prompt, "prefilled": prefilled, "reused": reused, "wall": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default="relay_ring.yaml",
                        help="a scenario of several rounds, in scenarios/")
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_hf(Path(tmp) / "llama", hidden_size=64, num_heads=2,
                              chat_template=True)
        print(f"{args.scenario}, {args.episodes} episodes, an HF Llama with a chat template, "
              f"{torch.get_num_threads()} thread(s)")
        print(f"{'prompt_format':>14} {'prompt tokens':>14} {'prefilled':>10} {'reused':>10} "
              f"{'reused share':>13} {'wall s':>7}")
        for fmt in ("transcript", "chat"):
            m = measure(args.scenario, model, fmt, args.episodes)
            print(f"{fmt:>14} {m['prompt']:14,} {m['prefilled']:10,} {m['reused']:10,} "
                  f"{m['reused'] / m['prompt']:13.2f} {m['wall']:7.2f}")


if __name__ == "__main__":
    main()
