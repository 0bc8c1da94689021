import os

from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.urls import include, path


def metrics(request: HttpRequest) -> HttpResponse:
    """Serve prometheus_client's default registry, or every process's values in multiprocess
    mode, as django-prometheus's ``/metrics`` does."""
    from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest

    registry = REGISTRY
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)


urlpatterns = [
    path("admin/", admin.site.urls),
    path("metrics", metrics),
    path("scheduling/", include("django_scheduling.urls")),
]
