"""The Celery app of tests/test_engines*.py and of the worker processes they start.

Broker and results on ``TEST_REDIS_URL`` (``scripts/redis-test-server``). Each test run uses its
own queue (``TEST_CELERY_QUEUE``), so that test sessions sharing the Redis server never take
each other's messages.
"""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:63799/0")

app = Celery("tests")
app.conf.update(
    broker_url=REDIS_URL,
    result_backend=REDIS_URL,
    task_default_queue=os.environ.get("TEST_CELERY_QUEUE", "celery"),
    broker_connection_retry_on_startup=True,
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    # Fail an enqueue at once when Redis is down, rather than after ~20 s of reconnecting to
    # the result backend (docs: "Scaling out").
    result_backend_transport_options={"retry_policy": {"max_retries": 0}},
    broker_transport_options={"max_retries": 1},
)
app.autodiscover_tasks(["tests.testapp"], related_name="engine_tasks")
