"""Populations of teams on Ray: population-based training over settings and topologies
(:mod:`populations.pbt`), self-play leagues (:mod:`populations.league`), and the classic
MARL baseline trained by RLlib (:mod:`populations.baseline`). The only package that
imports Ray at module level; install it with ``pip install -e '.[ray]'`` (populations) or
``pip install -e '.[rllib]'`` (the baseline)."""
