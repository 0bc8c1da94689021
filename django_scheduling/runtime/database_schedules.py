"""The schedules kept in the database, applied to a running scheduler.

At start, and then every ``SCHEDULES_POLL_INTERVAL`` on the maintenance thread, each instance
asks the table whether anything changed: one aggregate query (the number of rows, the highest
id, the sum of the revisions that each save and update counts). Only when something did does
it read the rows, work out each one's task (``tasks/stored.py``) and apply the difference:

- a new or changed schedule, or a code task moved or moved back, takes its new entry in the
  scheduler; a changed trigger starts afresh, as at a redeploy (``sync_tasks``);
- a deleted or disabled schedule stops firing, and its task row is marked removed;
- a row that names anything the code did not opt in never runs: its error is written on it,
  where the admin shows it.

Database schedules run on the instances that run every task of the code (``runscheduler``
without ``--task`` or ``--exclude``, autostart); an override moves a code task wherever it runs.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db.models import Count, F, Max, Sum

from ..conf import SchedulingSettings
from ..storage import task_rows
from ..tasks import stored
from ..tasks.definition import TaskDefinition
from ..tasks.registry import TaskRegistry

if TYPE_CHECKING:
    from .firing import FiringPipeline
    from .scheduler import Scheduler

__all__ = ["DatabaseSchedules"]

logger = logging.getLogger(__name__)

#: Rows whose error changes are written this many at a time (a statement's parameters).
_CHUNK = 500


class DatabaseSchedules:
    """What the table applies to one scheduler: the schedules it runs, and its code tasks as
    the overrides move them.

    Only those are kept, by name: a scheduler of ten thousand code tasks keeps no second list
    of them here; the registry has them.
    """

    def __init__(
        self,
        *,
        tasks: TaskRegistry,
        conf: SchedulingSettings,
        only: Collection[str] | None = None,
    ) -> None:
        self.tasks = tasks
        self.conf = conf
        #: The names of the code's tasks this instance runs; None: every one, and then the
        #: schedules of the table too.
        self.only = None if only is None else frozenset(only)
        #: What the table applies, by name, as of the last read.
        self.applied: dict[str, TaskDefinition] = {}
        self._fingerprint: tuple[Any, ...] | None = None

    def load(self, code: list[TaskDefinition]) -> list[TaskDefinition]:
        """Read the table and return the tasks to start with: *code* (the code's tasks this
        instance runs) as the table moves them, and the table's schedules."""
        fingerprint = self._read_fingerprint()
        self.applied = self._read()
        self._fingerprint = fingerprint
        return self._with(code, self.applied)

    def definitions(self, code: list[TaskDefinition]) -> list[TaskDefinition]:
        """Return the tasks to run as ``load()`` does, without writing anything
        (``runscheduler --list``)."""
        applied, _ = self.applied_by(stored.read(using=self.conf.database))
        return self._with(code, applied)

    def refresh(self, scheduler: Scheduler, pipeline: FiringPipeline, *, now: datetime) -> bool:
        """Apply what changed in the table since the last read; return whether anything did.

        Database errors are raised (the maintenance pass reports them), and the next pass
        reads again: nothing is taken as applied until it is.
        """
        fingerprint = self._read_fingerprint()
        if fingerprint == self._fingerprint:
            return False
        applied = self._read()
        changed = [d for name, d in applied.items() if self.applied.get(name) != d]
        gone = []
        for name in sorted(self.applied.keys() - applied.keys()):
            code = self._code(name)
            if code is None:
                gone.append(name)
            else:
                changed.append(code)  # moved back to the code's schedule
        if changed:
            # A schedule back after it was disabled, deleted or wrong does not run a backlog.
            back = self.stored([definition.name for definition in changed])
            specs = pipeline.specs(changed, complete=False, afresh=back)
            for spec in specs:
                scheduler.replace(spec)
            # An entry that waits for a run of the one it replaced is scheduled when that run
            # ends; its row shows its next fire time meanwhile, not none.
            times = {
                spec.name: spec.next_time(now) if spec.running else spec.next_fire_time
                for spec in specs
            }
            task_rows.publish_next_fire_times(times, using=self.conf.database)
        for name in gone:
            scheduler.remove(name)
        if gone:
            task_rows.mark_removed(gone, now=now, using=self.conf.database)
        if changed:
            logger.info("Schedules in the database: applied %s", ", ".join(d.name for d in changed))
        if gone:
            logger.info("Schedules in the database: stopped %s", ", ".join(gone))
        self.applied, self._fingerprint = applied, fingerprint
        return True

    def stored(self, names: list[str]) -> list[str]:
        """Return those of *names* that are schedules of the table, not code tasks."""
        return [name for name in names if self._code(name) is None]

    def _with(
        self, code: list[TaskDefinition], applied: Mapping[str, TaskDefinition]
    ) -> list[TaskDefinition]:
        """Return *code* with the definitions of *applied* in place of those it moves, then
        the table's schedules."""
        names = {definition.name for definition in code}
        moved = [applied.get(definition.name, definition) for definition in code]
        return moved + [d for name, d in applied.items() if name not in names]

    def _code(self, name: str) -> TaskDefinition | None:
        """Return the code's task *name*, if this instance runs it."""
        if name not in self.tasks or (self.only is not None and name not in self.only):
            return None
        definition = self.tasks.get(name)
        return definition if definition.error is None else None

    def _read(self) -> dict[str, TaskDefinition]:
        """Read the rows and return what they apply here, by name; write the error of each
        row that cannot run on it (and clear those fixed since)."""
        rows = stored.read(using=self.conf.database)
        applied, errors = self.applied_by(rows)
        self._write_errors(rows, errors)
        return applied

    def applied_by(
        self, rows: list[dict[str, Any]]
    ) -> tuple[dict[str, TaskDefinition], dict[str, str]]:
        """Return what *rows* apply here (the overrides of the code tasks it runs, and the
        schedules when it runs them), by name, and the error of each row that cannot run."""
        applied: dict[str, TaskDefinition] = {}
        errors: dict[str, str] = {}
        allowed = self.tasks.schedulable()  # once per read, not per row
        for row in rows:
            definition = stored.definition_of(
                row, tasks=self.tasks, conf=self.conf, allowed=allowed
            )
            if definition.error is not None:
                errors[row["name"]] = definition.error
            elif not row["enabled"]:
                continue
            elif row["override"]:
                if self._code(row["name"]) is not None:
                    applied[row["name"]] = definition
            elif self.only is None:
                applied[row["name"]] = definition
        return applied, errors

    def _read_fingerprint(self) -> tuple[Any, ...]:
        """Return what tells a change in the table: the number of rows, the highest id (a row
        created in place of a deleted one) and the sum of the revisions (each committed save
        or update adds one, counted by the database: no clock and no commit order can hide
        it). Read before the rows: a change in between is read next time."""
        from ..models import Schedule

        found = Schedule.objects.using(self.conf.database).aggregate(
            count=Count("pk"), newest=Max("pk"), revisions=Sum("revision")
        )
        return (found["count"], found["newest"], found["revisions"])

    def _write_errors(self, rows: list[dict[str, Any]], errors: Mapping[str, str]) -> None:
        """Write on each row the error it has now, where it differs from the one it shows,
        without counting a change (``revision`` and ``updated_at`` stay): one statement per
        distinct error, however many rows have it."""
        from ..models import Schedule

        changed: dict[str, list[str]] = {}
        for row in rows:
            error = errors.get(row["name"], "")
            if row["error"] != error:
                changed.setdefault(error, []).append(row["name"])
                if error:
                    logger.error("Schedule %r in the database cannot run: %s", row["name"], error)
        manager = Schedule.objects.using(self.conf.database)
        for error, names in changed.items():
            for first in range(0, len(names), _CHUNK):
                rows_of = manager.filter(name__in=names[first : first + _CHUNK])
                rows_of.update(error=error, updated_at=F("updated_at"), revision=F("revision"))
