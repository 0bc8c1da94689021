"""``manage.py runscheduler``: run the scheduler as a dedicated foreground process."""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from ...registry import registry
from ...service import SchedulerService


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
            help="List the tasks and their next fire times, and exit.",
        )
        parser.add_argument(
            "--shutdown-timeout",
            type=float,
            metavar="SECONDS",
            help="How long to wait for running tasks at shutdown (overrides SCHEDULING).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        definitions = self._select(options["tasks"], options["exclude"])
        if options["pool_size"] is not None and options["pool_size"] < 1:
            raise CommandError(f"--pool-size must be at least 1, got {options['pool_size']}")
        if options["list"]:
            self._list(definitions)
            return
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
            service.start()
            self._print_tasks(service)
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

    def _select(self, only: list[str] | None, exclude: list[str]) -> list | None:
        unknown = [n for n in (only or []) + exclude if n not in registry]
        if unknown:
            known = ", ".join(d.name for d in registry) or "none"
            raise CommandError(f"Unknown task(s): {', '.join(unknown)}. Known tasks: {known}")
        if not only and not exclude:
            return None
        chosen = [d for d in registry if (not only or d.name in only) and d.name not in exclude]
        return chosen

    def _list(self, definitions: list | None) -> None:
        now = timezone.now()
        zone = timezone.get_default_timezone()
        for definition in definitions if definitions is not None else registry:
            if definition.error:
                self.stdout.write(f"{definition.name}  INVALID: {definition.error}")
                continue
            trigger = definition.trigger(zone)
            first = trigger.next_fire_time(now=now, state=_fresh())
            self.stdout.write(f"{definition.name}  {trigger.describe()}  next {_local(first)}")

    def _print_tasks(self, service: SchedulerService) -> None:
        times = service.next_fire_times()
        for spec in service.specs:
            lock = "no lock" if spec.lock_config is None else "locked"
            self.stdout.write(
                f"  {spec.name}  {spec.trigger.describe()}  ({lock})  "
                f"next {_local(times.get(spec.name))}"
            )


def _fresh():
    from ...triggers import TriggerState

    return TriggerState()


def _local(moment: Any) -> str:
    if moment is None:
        return "never"
    return timezone.localtime(moment).isoformat(timespec="seconds")
