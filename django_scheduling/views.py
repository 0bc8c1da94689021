"""The probes: ``path("scheduling/", include("django_scheduling.urls"))`` serves

- ``scheduling/health/``: whether any task is overdue, across every instance (a monitoring
  check: 503 when one is). Anyone learns whether all is well and how many tasks are overdue;
  the names of the tasks, hosts and pids need ``HEALTH_TOKEN`` or a staff session.
- ``scheduling/live/``: whether this process's scheduler works (a liveness probe): its
  threads run and its maintenance thread ends its passes. No database query.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils.crypto import constant_time_compare
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe

from .checks import scheduler_errors
from .clock import utcnow
from .conf import InvalidSettings, get_settings
from .observability.health import public, report
from .runtime.service import current_service
from .startup.autostart import refused_because
from .storage.errors import missing_table

__all__ = ["health", "live", "liveness_body"]

logger = logging.getLogger(__name__)


@never_cache
@require_safe
def health(request: HttpRequest) -> HttpResponse:
    """Answer 200 when no task is overdue and 503 when one is, or when the scheduler cannot
    run (its configuration is wrong, its tables are missing, the database does not answer).

    The body is the report of ``scheduling_status --json`` for a request that carries
    ``Authorization: Bearer <HEALTH_TOKEN>`` or comes from a staff user; for anyone else, only
    ``ok`` and the counts. A request with another token gets 401.
    """
    token = _health_token()
    given = _bearer(request)
    if given is not None and (token is None or not constant_time_compare(given, token)):
        response = JsonResponse({"detail": "The token is not valid."}, status=401)
        response["WWW-Authenticate"] = "Bearer"
        return response
    full = given is not None or _is_staff(request)
    body = _report()
    return JsonResponse(body if full else public(body), status=200 if body["ok"] else 503)


def _report() -> dict[str, Any]:
    try:
        conf = get_settings()
    except InvalidSettings:
        errors = scheduler_errors()
        problems = [{"id": error.id, "message": error.msg} for error in errors]
        return {"ok": False, "configuration_errors": len(errors), "problems": problems}
    try:
        return report(
            now=utcnow(),
            overdue_after=conf.overdue_after,
            heartbeat_interval=conf.heartbeat_interval,
            using=conf.database,
        )
    except DatabaseError as exc:
        if missing_table(exc):
            error = "the database has no django_scheduling tables; run `python manage.py migrate`"
            return {"ok": False, "error": error}
        logger.warning("The health check cannot read the database: %s", exc)
        return {"ok": False, "database_unavailable": True}


def _health_token() -> str | None:
    """Return ``SCHEDULING['HEALTH_TOKEN']``, read from the raw setting when the rest of it is
    invalid: a configuration error must still be shown to the token's holder."""
    try:
        return get_settings().health_token
    except InvalidSettings:
        raw = getattr(settings, "SCHEDULING", None)
        token = raw.get("HEALTH_TOKEN") if isinstance(raw, Mapping) else None
        return token if isinstance(token, str) and token else None


def _bearer(request: HttpRequest) -> str | None:
    """Return the token of an ``Authorization: Bearer`` header; ``""`` for another scheme."""
    header = request.headers.get("Authorization")
    if header is None:
        return None
    scheme, _, given = header.partition(" ")
    return given.strip() if scheme.lower() == "bearer" else ""


def _is_staff(request: HttpRequest) -> bool:
    user = getattr(request, "user", None)
    return bool(
        user is not None
        and user.is_active
        and user.is_staff
        and user.has_perm("django_scheduling.view_scheduledtask")
    )


@never_cache
@require_safe
def live(request: HttpRequest) -> HttpResponse:
    """Answer 200 while this process's scheduler works (or none is meant to run here), 503
    once it has stopped or one of its threads has."""
    status, body = liveness_body()
    return JsonResponse(body, status=status)


def liveness_body() -> tuple[int, dict[str, Any]]:
    """Return the status and body of the liveness probe of this process."""
    service = current_service()
    if service is None:
        if refused_because():
            return 200, {"alive": True, "scheduler": "refused: see manage.py check"}
        return 200, {"alive": True, "scheduler": "none in this process"}
    liveness = service.liveness()
    body: dict[str, Any] = {"alive": liveness.alive, "scheduler": liveness.state}
    if liveness.problems:
        body["problems"] = list(liveness.problems)
    return (200 if liveness.alive else 503), body
