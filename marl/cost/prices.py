"""Token prices: a pinned LiteLLM-format table bundled with the package, plus overrides.

Values are parsed as :class:`decimal.Decimal` straight from the JSON text, so ledger sums
are exact. Nothing is fetched at run time.
"""

from __future__ import annotations

import json
from decimal import Decimal
from functools import cache
from importlib import resources

from orchestration.cost import TokenPrice

#: LiteLLM field names, in :class:`TokenPrice` order.
PRICE_FIELDS = ("input_cost_per_token", "cache_read_input_token_cost", "output_cost_per_token")


@cache
def price_table() -> dict[str, dict[str, Decimal | str]]:
    """The bundled table: model name -> LiteLLM fields.

    >>> price_table()["gpt-4o-mini"]["input_cost_per_token"]
    Decimal('1.5E-7')
    """
    text = resources.files("marl").joinpath("data/prices.json").read_text()
    table = json.loads(text, parse_float=Decimal, parse_int=Decimal)
    return {k: v for k, v in table.items() if not k.startswith("_")}


def token_price(model: str, overrides: dict[str, Decimal | None] | None = None) -> TokenPrice:
    """Price of ``model`` from the table, with non-None ``overrides`` (LiteLLM field names)
    taking precedence. A missing cache-read price falls back to the input price.

    >>> token_price("gpt-4o-mini", {"output_cost_per_token": Decimal("1e-6")}).output
    Decimal('0.000001')
    """
    entry = dict(price_table()[model])
    entry.update({k: v for k, v in (overrides or {}).items() if v is not None})
    p_in = Decimal(entry.get("input_cost_per_token", 0))
    p_cache = Decimal(entry.get("cache_read_input_token_cost", p_in))
    p_out = Decimal(entry.get("output_cost_per_token", 0))
    return TokenPrice(p_in, p_cache, p_out)
