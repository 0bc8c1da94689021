"""An app installed after ``django_scheduling``, for the configuration process tests.

With ``CONFIG_READY_PROBE=<seconds>`` its ``ready()`` holds app loading open until a thread other
than the main one has run a database query, or until the seconds have passed. A scheduler that
queried the database while apps are still loading is then caught doing it every time, instead of
in the rare start where its thread wins the race against the last ``ready()``.
"""

import os
import threading

from django.apps import AppConfig


class ConfigAppConfig(AppConfig):
    name = "tests.configapp"
    label = "configapp"

    def ready(self) -> None:
        seconds = os.environ.get("CONFIG_READY_PROBE")
        if seconds:
            wait_for_a_query_from_another_thread(float(seconds))


def wait_for_a_query_from_another_thread(seconds: float) -> None:
    from django.db.backends.signals import connection_created

    queried = threading.Event()
    main = threading.current_thread()

    def after_query(execute, sql, params, many, context):
        try:
            return execute(sql, params, many, context)
        finally:  # the query ran, or raised the warning turned into an error
            queried.set()

    def on_connect(sender, connection, **kwargs):
        if threading.current_thread() is not main:
            connection.execute_wrappers.append(after_query)

    connection_created.connect(on_connect, weak=False)
    try:
        queried.wait(seconds)
    finally:
        connection_created.disconnect(on_connect)
