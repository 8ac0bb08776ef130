"""What tokens cost: the pinned price table (:mod:`marl.cost.prices`), the per-call ledger
of what was measured (:mod:`marl.cost.ledger`), and a team's predicted tokens and cost
per episode (:mod:`marl.cost.predict`, over the analytic model of
:mod:`orchestration.cost`). Batched totals are a kernel (:mod:`marl.kernels.costs`);
what runs spent is analysed in :mod:`marl.analysis.spend`."""
