"""Populations of teams on Ray: population-based training over settings and topologies
(:mod:`populations.pbt`). The only package that imports Ray at module level; install it
with ``pip install -e '.[ray]'``."""
