"""The app's URLs: ``path("scheduling/", include("django_scheduling.urls"))``."""

from __future__ import annotations

from django.urls import path

from . import views

app_name = "django_scheduling"

urlpatterns = [
    path("health/", views.health, name="health"),
    path("live/", views.live, name="live"),
]
