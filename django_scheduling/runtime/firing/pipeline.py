"""The firing pipeline: every firing, of every kind, takes the same steps.

1. **decide** (``decide.py``): read the rows of a batch of firings in one statement, and ask
   ``schedules.decisions`` what each does: run, serve a paused fire time, or skip;
2. **claim** (``claim.py``): in one transaction, take the locks of the locked tasks, record the
   runs' starts, claim their fire times or take their run requests, and enqueue the firings
   whose engine commits with the claim;
3. **hand over**: each claimed firing becomes a ``ClaimedRun``, which the scheduler starts on
   its worker pool: ``invoke.py`` calls the task in-process, ``enqueue.py`` publishes it to its
   engine;
4. **record** (``record.py``): the end goes to the writer thread, which stores it with the ends
   of the other runs that ended meanwhile;
5. **release**: the writer releases the lock once the end is stored, then tells the scheduler
   when the entry fires next.

A scheduled firing or a run asked for, a recovery or a catch-up, a locked task or one with
``lock=False``, called here or enqueued: all of them take these steps, and a firing alone is a
batch of one. The firings that do not run here (held elsewhere, already run, paused, during an
outage) are ``contention.py``'s.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection
from datetime import datetime, tzinfo

from ...clock import utcnow
from ...conf import SchedulingSettings
from ...locking import BaseLockProvider
from ...schedules.decisions import scheduled_for
from ...storage import history, task_rows
from ...storage.connections import KeptConnection
from ...tasks.definition import TaskDefinition
from ...tasks.resolved import resolve
from ..calls import Call, Entry, Firing, Outcome
from ..keepalive import KeepAlive
from ..outbox import Outbox
from ..pool import PoolStats
from ..writer import EndWriter
from .claim import Claimer
from .contention import Contention
from .decide import Decider
from .enqueue import Enqueuer
from .invoke import Invoker, Underway
from .record import Recorder
from .runs import UNSET
from .spec import TaskSpec

__all__ = ["FiringPipeline"]

logger = logging.getLogger(__name__)


class FiringPipeline:
    """Decide, claim and hand over the firings the scheduler dispatches; the scheduler's
    ``Dispatcher``."""

    def __init__(
        self,
        *,
        conf: SchedulingSettings,
        provider: BaseLockProvider,
        default_zone: tzinfo,
        clock: Callable[[], datetime] = utcnow,
        keepalive: KeepAlive | None = None,
        outbox: Outbox | None = None,
        writer: EndWriter | None = None,
    ) -> None:
        self.conf = conf
        self.provider = provider
        self.default_zone = default_zone
        self._clock = clock
        self.using = using = conf.database
        self._keepalive = keepalive
        self.outbox = outbox if outbox is not None else Outbox()
        #: Records the ends of runs and releases their locks. Without a thread of its own
        #: (not started), it writes each end on the thread that hands it in.
        self.writer = writer or EndWriter(
            using=using, provider=provider, outbox=self.outbox, name="scheduling-writer"
        )
        #: Set when the scheduler stops: a retry that waits gives up.
        self.stopping = threading.Event()
        self._connection = KeptConnection(using)
        self.contention = Contention(
            using=using, misfire_threshold=conf.misfire_threshold, clock=clock
        )
        self.recorder = Recorder(
            using=using,
            instance=conf.instance_name,
            history_on=conf.history,
            clock=clock,
            writer=self.writer,
            outbox=self.outbox,
            contention=self.contention,
        )
        self.underway = Underway()
        self.invoker = Invoker(
            recorder=self.recorder, underway=self.underway, stopping=self.stopping, clock=clock
        )
        self.enqueuer = Enqueuer(
            using=using,
            recorder=self.recorder,
            underway=self.underway,
            stopping=self.stopping,
            clock=clock,
        )
        self.decider = Decider(using=using, clock=clock, contention=self.contention)
        self.claimer = Claimer(
            using=using,
            history_on=conf.history,
            provider=provider,
            keepalive=keepalive,
            writer=self.writer,
            clock=clock,
            contention=self.contention,
            recorder=self.recorder,
            invoker=self.invoker,
            enqueuer=self.enqueuer,
            underway=self.underway,
        )

    @property
    def clock(self) -> Callable[[], datetime]:
        """The time source of every part of the pipeline."""
        return self._clock

    @clock.setter
    def clock(self, clock: Callable[[], datetime]) -> None:
        self._clock = clock
        for part in (
            self.contention,
            self.recorder,
            self.invoker,
            self.enqueuer,
            self.decider,
            self.claimer,
        ):
            part.clock = clock

    @property
    def keepalive(self) -> KeepAlive | None:
        """Extends the locks of the runs under way (``None``: nothing extends them)."""
        return self._keepalive

    @keepalive.setter
    def keepalive(self, keepalive: KeepAlive | None) -> None:
        self._keepalive = self.claimer.keepalive = keepalive

    @property
    def outage(self) -> threading.Event:
        """Set when a firing met an unreachable database (see ``Contention.outage``)."""
        return self.contention.outage

    @property
    def skipped(self) -> int:
        return self.contention.skipped

    # -- set-up --------------------------------------------------------------------------------

    def specs(
        self, definitions: list[TaskDefinition], *, complete: bool, afresh: Collection[str] = ()
    ) -> list[TaskSpec]:
        """Build the specs of *definitions* and bring their rows in step with the code; those
        named in *afresh* start afresh if their rows were removed (see ``sync_tasks``)."""
        resolved = [resolve(d, self.conf, self.default_zone) for d in definitions]
        states = task_rows.sync_tasks(
            [(task.name, task.trigger) for task in resolved],
            now=self.clock(),
            using=self.using,
            complete=complete,
            afresh=afresh,
        )
        return [TaskSpec(name=task.name, task=task, _state=states[task.name]) for task in resolved]

    def first_fire_time(self, entry: Entry, *, now: datetime) -> datetime | None:
        spec: TaskSpec = entry.payload
        return spec.next_time(now)

    # -- dispatch ------------------------------------------------------------------------------

    def dispatch(self, items: list[tuple[Entry, Firing]]) -> list[Outcome]:
        """Decide and claim the firings *items* together, in a few statements whatever their
        number, and say what becomes of each: a ``ClaimedRun`` for those that run here, the
        entry's next fire time for the others. Never raises."""
        specs: list[TaskSpec] = [entry.payload for entry, _ in items]
        firings = [firing for _, firing in items]
        outcomes: list[Outcome] = [UNSET] * len(items)
        with self._connection.use():
            try:
                decided = self.decider.decide(specs, firings, outcomes)
                if decided.claims:
                    self.claimer.claim(decided, outcomes)
                for spec in specs:
                    spec.database_failures = 0  # the database answered
            except Exception as exc:
                # A failure before the claims committed: nothing ran, nothing is held. Those
                # not settled yet back off.
                unsettled = [index for index, outcome in enumerate(outcomes) if outcome is UNSET]
                retries = self.contention.back_off(
                    [(specs[index], firings[index]) for index in unsettled], exc
                )
                for index, retry in zip(unsettled, retries, strict=True):
                    outcomes[index] = retry
        return outcomes

    def run(self, entry: Entry, firing: Firing) -> datetime | None:
        """Fire *entry* once for *firing*, on this thread, and return when it fires next: a
        batch of one, run to its recorded end (for tests and tools)."""
        [outcome] = self.dispatch([(entry, firing)])
        if not isinstance(outcome, Call):
            return outcome
        told = threading.Event()
        next_times: list[datetime | None] = []

        def done(call: Call, next_time: datetime | None) -> None:
            next_times.append(next_time)
            told.set()

        outcome.entry = entry
        outcome.run(done)
        told.wait()
        return next_times[0]

    def rejected(self, entry: Entry, firing: Firing, stats: PoolStats) -> datetime | None:
        """Note a firing the pool had no room for, before its claim, and return when its
        entry fires next. On the dispatcher thread: the record is written later, through the
        outbox."""
        spec: TaskSpec = entry.payload
        fire_time = scheduled_for(firing)
        self.recorder.rejected(spec, fire_time, stats)
        if fire_time is None:
            return entry.next_fire_time
        return self.contention.skipped_firing(spec, fire_time, "rejected", assume_ran=True)

    def drain(self, timeout: float | None) -> bool:
        """Wait until the ends of the runs handed to the writer are recorded."""
        return self.writer.drain(timeout)

    # -- runs under way ------------------------------------------------------------------------

    def running(self) -> dict[str, float]:
        """Return the tasks that run on this process's worker threads now, with how many
        seconds each has run."""
        return self.underway.durations()

    def watch_timeouts(self, monotonic: float) -> list[str]:
        return self.invoker.watch_timeouts(monotonic)

    def interrupted(self, names: list[str]) -> None:
        """Mark the runs of *names*, still running at shutdown, as interrupted, and release
        their locks: this process is about to exit, and another instance may take over."""
        # Those claimed, but the pool shut down before they started: their fire times are
        # spent (at most once), their locks are released here.
        running, claimed = self.underway.take(names)
        for run in [item.run for item in running] + claimed:
            run.release_lock()
        # Only those that ran: a claimed run that never started is left to housekeeping,
        # which marks it lost (and ``recover=True`` runs its fire time again).
        run_ids = [item.run_id for item in running if item.run_id is not None]
        history.mark_interrupted(using=self.using, run_ids=run_ids, now=self.clock())
