"""Populations of teams on Ray: population-based training over settings and topologies
(:mod:`populations.pbt`), self-play leagues (:mod:`populations.league`) and sweep cells as
Ray tasks (:mod:`populations.cells`). The one package that imports Ray at module level;
install it with ``pip install -e '.[ray]'``."""

from marl import _moved

_moved.install()  # populations.baseline and .session moved into marl/ (one release)
