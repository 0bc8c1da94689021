"""The health endpoint: ``path("scheduling/", include("django_scheduling.urls"))`` serves it
at ``scheduling/health/``, for load balancers, Kubernetes probes and uptime checks."""

from __future__ import annotations

import logging

from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils.crypto import constant_time_compare
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe

from .clock import utcnow
from .conf import InvalidSettings, get_settings
from .health import report

__all__ = ["health"]

logger = logging.getLogger(__name__)


@never_cache
@require_safe
def health(request: HttpRequest) -> HttpResponse:
    """Answer 200 when no task is overdue and 503 when one is, with the report of
    ``scheduling_status --json`` as the body.

    With ``SCHEDULING['HEALTH_TOKEN']`` set, the request must carry it, as
    ``Authorization: Bearer <token>``; otherwise it gets 401.
    """
    try:
        conf = get_settings()
    except InvalidSettings:
        # The settings cannot be read, so neither can the token: say nothing more.
        return JsonResponse({"ok": False}, status=503)
    if conf.health_token is not None and not _authorized(request, conf.health_token):
        response = JsonResponse({"detail": "A token is needed."}, status=401)
        response["WWW-Authenticate"] = "Bearer"
        return response
    try:
        body = report(
            now=utcnow(),
            overdue_after=conf.overdue_after,
            heartbeat_interval=conf.heartbeat_interval,
            using=conf.database,
        )
    except DatabaseError as exc:
        logger.warning("The health check cannot read the database: %s", exc)
        return JsonResponse({"ok": False, "database_unavailable": True}, status=503)
    return JsonResponse(body, status=200 if body["ok"] else 503)


def _authorized(request: HttpRequest, token: str) -> bool:
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    return scheme.lower() == "bearer" and constant_time_compare(given.strip(), token)
