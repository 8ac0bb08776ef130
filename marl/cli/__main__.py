"""``python -m marl.cli``: the same as the ``marl`` command."""

from marl.cli import main

main()
