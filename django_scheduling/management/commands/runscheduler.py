"""``manage.py runscheduler``: run the scheduler as a dedicated foreground process."""

from __future__ import annotations

import ctypes
import gc
import signal
import threading
from datetime import datetime
from types import FrameType
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, connections
from django.utils import timezone

from ...conf import get_settings
from ...models import ScheduledTask
from ...observability import metrics
from ...runtime.database_schedules import DatabaseSchedules
from ...runtime.service import SchedulerService
from ...schedules.triggers import TriggerState
from ...storage.errors import describe_database_error
from ...tasks.registry import TaskDefinition, registry
from ...tasks.resolved import resolve

#: At start, the tasks are listed up to this many. The scheduler is firing by then: a list of
#: 10,000 tasks held its threads back for 0.2-0.5 s per process (three on two cores), while
#: the first burst was claimed, and a log of that length says nothing at a glance.
LISTED_AT_START = 50


class Command(BaseCommand):
    help = (
        "Run the scheduled tasks in this process until SIGTERM or SIGINT (Ctrl-C), whatever "
        "SCHEDULING['AUTOSTART'] says."
    )
    requires_system_checks = "__all__"

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--task",
            action="append",
            dest="tasks",
            metavar="NAME",
            help="Run only this task (repeat for several). Default: every task.",
        )
        parser.add_argument(
            "--exclude",
            action="append",
            default=[],
            metavar="NAME",
            help="Do not run this task (repeat for several).",
        )
        parser.add_argument(
            "--pool-size", type=int, help="Core and maximum pool size (overrides SCHEDULING)."
        )
        parser.add_argument(
            "--list",
            action="store_true",
            help="List the tasks with what the database says of them (next fire time, paused, "
            "done), and exit.",
        )
        parser.add_argument(
            "--shutdown-timeout",
            type=float,
            metavar="SECONDS",
            help="How long to wait for running tasks at shutdown (overrides SCHEDULING).",
        )
        parser.add_argument(
            "--health-port",
            type=int,
            metavar="PORT",
            help="Answer the liveness probe at /live on this port (200 while the scheduler "
            "works, 503 once it has stopped).",
        )
        parser.add_argument(
            "--metrics-port",
            type=int,
            metavar="PORT",
            help="Serve Prometheus metrics at /metrics on this port (needs the prometheus extra).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        definitions = self._select(options["tasks"], options["exclude"])
        if options["pool_size"] is not None and options["pool_size"] < 1:
            raise CommandError(f"--pool-size must be at least 1, got {options['pool_size']}")
        if options["list"]:
            self._list(definitions)
            return
        if options["metrics_port"] is not None:
            self._serve_metrics(options["metrics_port"])
        if options["health_port"] is not None:
            self._serve_probe(options["health_port"])
        service = SchedulerService(
            None if definitions is None else definitions,
            core_pool_size=options["pool_size"],
            max_pool_size=options["pool_size"],
        )
        stop = threading.Event()

        def request_stop(signum: int, frame: FrameType | None) -> None:
            self.stderr.write(f"Received {signal.Signals(signum).name}, shutting down")
            stop.set()

        previous = {
            sig: signal.signal(sig, request_stop) for sig in (signal.SIGTERM, signal.SIGINT)
        }
        try:
            try:
                service.start()
            except DatabaseError as exc:
                raise CommandError(
                    f"Cannot start the scheduler: {describe_database_error(exc)}"
                ) from exc
            self._print_tasks(service)
            _settle_memory()
            self.stdout.write("Scheduler running; press Ctrl-C (or send SIGTERM) to stop.")
            self.stdout.flush()
            # Python runs signal handlers in the main thread only, and only when it wakes: a
            # signal the kernel hands to a worker thread would wait out one long sleep.
            while not stop.wait(0.25):
                pass
        finally:
            still_running = service.stop(timeout=options["shutdown_timeout"])
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if still_running:
            self.stderr.write("Still running at shutdown: " + ", ".join(still_running))
        self.stdout.write("Scheduler stopped.")

    def _serve_probe(self, port: int) -> None:
        from ...observability.probes import serve_probe
        from ...views import liveness_body

        try:
            serve_probe(port, liveness_body)
        except OSError as exc:
            raise CommandError(f"Cannot serve the liveness probe on port {port}: {exc}") from None
        self.stdout.write(f"Serving the liveness probe at http://0.0.0.0:{port}/live")

    def _serve_metrics(self, port: int) -> None:
        try:
            metrics.serve(port)
        except metrics.MetricsUnavailable as exc:
            raise CommandError(str(exc)) from None
        except OSError as exc:
            raise CommandError(f"Cannot serve the metrics on port {port}: {exc}") from None
        self.stdout.write(f"Serving metrics at http://0.0.0.0:{port}/metrics")

    def _select(self, only: list[str] | None, exclude: list[str]) -> list | None:
        unknown = [n for n in (only or []) + exclude if n not in registry]
        if unknown:
            known = ", ".join(d.name for d in registry) or "none"
            raise CommandError(f"Unknown task(s): {', '.join(unknown)}. Known tasks: {known}")
        if not only and not exclude:
            return None
        chosen = [d for d in registry if (not only or d.name in only) and d.name not in exclude]
        return chosen

    def _list(self, definitions: list[TaskDefinition] | None) -> None:
        now = timezone.now()
        zone = timezone.get_default_timezone()
        conf = get_settings()
        definitions = self._with_database_schedules(definitions)
        rows = self._rows([d.name for d in definitions])
        for definition in definitions:
            if definition.error:
                self.stdout.write(f"{definition.name}  INVALID: {definition.error}")
                continue
            # The times the scheduler uses: the trigger and jitter the settings give.
            task = resolve(definition, conf, zone)
            row = rows.get(definition.name)
            if row is None or row.trigger != task.described:
                # Not scheduled yet, or with another trigger: the next start begins afresh.
                first = task.trigger.next_fire_time(now=now, state=TriggerState())
                when = f"next {_local(task.dispatch_time(first))}"
            else:
                computed = task.trigger.next_fire_time(now=now, state=_state(row))
                when = _row_state(row, task.dispatch_time(computed))
            moved = definition.name in registry and definition != registry.get(definition.name)
            note = "  (moved from the code's schedule in the admin)" if moved else ""
            self.stdout.write(f"{definition.name}  {task.trigger.describe()}  {when}{note}")

    def _with_database_schedules(self, chosen: list[TaskDefinition] | None) -> list[TaskDefinition]:
        """Return the tasks to list: the code's (all, or those *chosen*), as the schedules in
        the database move them, and those schedules when all run here; the code's alone, with
        a note, when the database cannot say."""
        code = list(registry) if chosen is None else chosen
        invalid = [d for d in code if d.error]
        valid = [d for d in code if not d.error]
        only = None if chosen is None else [d.name for d in valid]
        schedules = DatabaseSchedules(tasks=registry, conf=get_settings(), only=only)
        try:
            found = schedules.definitions(valid)
        except DatabaseError as exc:
            self.stderr.write(f"Showing the code's schedules only: {describe_database_error(exc)}.")
            return code
        return sorted(invalid + found, key=lambda d: d.name)

    def _rows(self, names: list[str]) -> dict[str, ScheduledTask]:
        """Return the task rows of *names*; none, with a note, when the database cannot say."""
        try:
            manager = ScheduledTask.objects.using(get_settings().database)
            return {row.name: row for row in manager.filter(name__in=names)}
        except DatabaseError as exc:
            self.stderr.write(
                f"Showing the times the code gives, not the database's: "
                f"{describe_database_error(exc)}."
            )
            return {}

    def _print_tasks(self, service: SchedulerService) -> None:
        """Print the first ``LISTED_AT_START`` tasks with their next fire times, and how many
        more there are."""
        times = service.next_fire_times()
        specs = service.specs
        for spec in specs[:LISTED_AT_START]:
            lock = "locked" if spec.definition.lock else "no lock"
            self.stdout.write(
                f"  {spec.name}  {spec.trigger.describe()}  ({lock})  "
                f"next {_local(times.get(spec.name))}"
            )
        if len(specs) > LISTED_AT_START:
            self.stdout.write(
                f"  ... and {len(specs) - LISTED_AT_START:,} more tasks: "
                "`manage.py runscheduler --list` lists every one."
            )


def _state(row: ScheduledTask) -> TriggerState:
    return TriggerState(row.anchor, row.last_fire_time, row.last_finished_at)


def _row_state(row: ScheduledTask, computed: datetime | None) -> str:
    """Say when the task of *row* fires next: the time a scheduler stored, else the time its
    state gives; that it is done, for a one-shot that fired; that it is paused."""
    if row.next_fire_time is None and computed is None and row.last_fire_time is not None:
        return f"done: fired at {_local(row.last_fire_time)}"
    when = f"next {_local(row.next_fire_time or computed)}"
    return f"paused, {when}" if row.paused else when


def _local(moment: Any) -> str:
    if moment is None:
        return "never"
    return timezone.localtime(moment).isoformat(timespec="seconds")


def _settle_memory() -> None:
    """Once started: put what start-up built out of the garbage collector's sight, and give the
    memory its transient objects left free back to the system.

    What start-up built (Django, the project, the tasks) lives as long as the process; out of
    the collector's sight, a full collection no longer walks it, which at thousands of tasks
    paused every thread for tens of milliseconds every few seconds. The rows read and written
    to sync the tasks are gone by now; glibc keeps their memory unless asked (``malloc_trim``;
    other C libraries have no such call, and keep theirs). The main thread's connection, which
    did that syncing, is closed too (with SQLite's page cache): the scheduler's own threads
    keep theirs, and a stop reconnects if it needs to.
    """
    connections.close_all()
    gc.collect()
    gc.freeze()
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return
    trim(0)
