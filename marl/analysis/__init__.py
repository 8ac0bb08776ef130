"""Reading run directories back: learning curves, cost versus reward, where tokens go and
how agents came to collaborate (``marl analyze``, ``marl sweep``).

Nothing here imports torch except :mod:`marl.analysis.replay`, which replays policies from a
checkpoint and says what the replays cost.
"""
