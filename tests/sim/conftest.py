"""Simulator tests: ``-m sim`` selects the seed regression set and the planted bugs."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "sim: runs whole simulations (the seed regression set, planted bugs)")
