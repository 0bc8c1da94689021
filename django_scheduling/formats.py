"""How times are written for people: one format, in the current time zone, with the zone."""

from __future__ import annotations

from datetime import datetime

from django.utils import dateformat, timezone

__all__ = ["TIME_FORMAT", "format_time"]

#: ``2026-03-29 03:00:05 CEST``: sorts as text, shows the seconds, names the zone.
TIME_FORMAT = "Y-m-d H:i:s T"


def format_time(moment: datetime | None) -> str:
    """Return *moment* in the current time zone, to the second, with the zone's abbreviation.

    Return "-" for ``None``. A naive *moment* (``USE_TZ = False``, which the system checks
    report) is written as it is, without a zone.
    """
    if moment is None:
        return "-"
    if timezone.is_aware(moment):
        moment = timezone.localtime(moment)
    return dateformat.format(moment, TIME_FORMAT)
