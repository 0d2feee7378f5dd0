"""The hardware comparison run locally refuses a bad price before it prepares or trains (the order a
cluster keeps: tests/unit/core/test_validation.py)."""

from __future__ import annotations

import pytest


@pytest.mark.slow
def test_the_comparison_refuses_a_bad_price_before_it_prepares_or_trains():
    from tasks.core.data.config import DataConfig
    from workflows.comparison import hardware_comparison

    with pytest.raises(Exception, match=r"input 'prices\['cpu'\]' = -1.0: must be a finite number >= 0"):
        hardware_comparison(data=DataConfig("/no/such/data.parquet"), prices={"cpu": -1.0, "nvidia-l4": 1})
