"""
Spring's CronExpressionTests, as data: every case must give the same chain of next() results.

The data in tests/data/ is a copy of the shared reference (see its README): `cron_cases.json` holds
the cases, `cron_equivalences.json` pairs of expressions that must behave alike.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from django_scheduling.schedules.cron import CronExpression

from .cron_chain import chain

DATA = Path(__file__).parent / "data"
CASES = json.loads((DATA / "cron_cases.json").read_text())
EQUIVALENCES = json.loads((DATA / "cron_equivalences.json").read_text())

BERLIN = ZoneInfo("Europe/Berlin")


def _instants(values: list[datetime | None]) -> list[datetime | None]:
    # Compare aware results in UTC: within a zone, == ignores fold.
    return [
        value if value is None or value.tzinfo is None else value.astimezone(UTC)
        for value in values
    ]


def _expected(case: dict) -> list[datetime | None]:
    return [None if value is None else datetime.fromisoformat(value) for value in case["expected"]]


@pytest.mark.parametrize("case", CASES, ids=[case["id"] for case in CASES])
def test_spring_case(case: dict) -> None:
    expression = CronExpression.parse(case["expr"])
    start = datetime.fromisoformat(case["start"])
    expected = _expected(case)
    if case["zone"] == "UTC":
        # Spring's LocalDateTime tests: the same wall times, naive and in aware UTC.
        naive = [None if value is None else value.replace(tzinfo=None) for value in expected]
        assert chain(expression, start.replace(tzinfo=None), len(expected)) == naive
        aware = chain(expression, start.astimezone(UTC), len(expected))
        assert aware == expected
        assert all(value is None or value.tzinfo is UTC for value in aware)
    else:
        zone = ZoneInfo(case["zone"])
        results = chain(expression, start.astimezone(zone), len(expected))
        assert len(results) == len(expected)
        for result, wanted in zip(results, expected, strict=True):
            if wanted is None:
                assert result is None
            else:
                assert result is not None
                assert result.tzinfo is zone
                # The same instant (compared in UTC: == across zones is False in a fold)...
                assert result.astimezone(UTC) == wanted.astimezone(UTC)
                # ... and the same wall clock reading and offset.
                assert result.replace(tzinfo=None) == wanted.replace(tzinfo=None)
                assert result.utcoffset() == wanted.utcoffset()


def test_every_case_was_run() -> None:
    assert len(CASES) == 82


EQUIVALENCE_STARTS = [
    datetime(2021, 1, 1),
    datetime(2023, 2, 27, 23, 59, 58, 500_000),
    datetime(2024, 2, 28, 12, 0),
    datetime(2026, 12, 31, 23, 59, 59),
]


@pytest.mark.parametrize(
    "pair", EQUIVALENCES["equivalences"], ids=[pair["id"] for pair in EQUIVALENCES["equivalences"]]
)
def test_equivalent_expressions(pair: dict) -> None:
    first, second = CronExpression.parse(pair["a"]), CronExpression.parse(pair["b"])
    assert first == second
    assert hash(first) == hash(second)
    for start in EQUIVALENCE_STARTS:
        assert chain(first, start, 25) == chain(second, start, 25)
        zoned = start.replace(tzinfo=BERLIN)
        assert _instants(chain(first, zoned, 25)) == _instants(chain(second, zoned, 25))


@pytest.mark.parametrize("macro, expansion", sorted(EQUIVALENCES["macros"].items()))
def test_macro_table(macro: str, expansion: str) -> None:
    assert CronExpression.parse(macro) == CronExpression.parse(expansion)
    # Spring resolves macros case-insensitively, after trimming.
    assert CronExpression.parse(f"  {macro.upper()} ") == CronExpression.parse(expansion)
    start = datetime(2024, 2, 28, 12, 0)
    for _ in range(10):
        start += timedelta(days=37)
        assert CronExpression(macro).next(start) == CronExpression(expansion).next(start)
