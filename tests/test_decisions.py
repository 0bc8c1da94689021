"""``decide()``: what a firing does, from the trigger, the stored row and the time. Pure."""

from datetime import UTC, datetime, timedelta

from django.test import SimpleTestCase

from django_scheduling.runtime.scheduler import RunRequest
from django_scheduling.schedules.decisions import TRIGGER_CHANGED, Run, Skip, decide
from django_scheduling.schedules.triggers import FixedRateTrigger, TriggerState
from django_scheduling.storage.task_rows import TaskRow

T0 = datetime(2026, 3, 29, 0, 59, 58, tzinfo=UTC)  # two seconds before Berlin springs forward
SECOND = timedelta(seconds=1)
RATE = FixedRateTrigger(timedelta(seconds=10))
DESCRIBED = "every 10s"


def row(last_fire_time=None, **fields):
    fields.setdefault("trigger", DESCRIBED)
    return TaskRow(TriggerState(anchor=T0, last_fire_time=last_fire_time), False, **fields)


class DecideTests(SimpleTestCase):
    def decide(self, stored, *, now=T0, firing=T0):
        return decide(RATE, DESCRIBED, stored, now=now, firing=firing)

    def test_a_due_fire_time_runs_with_a_claim(self):
        self.assertEqual(self.decide(row()), Run(T0, claim=True))

    def test_the_fire_time_comes_from_the_row_not_from_the_firing(self):
        # Woken late (after a back-off): the row says which fire time is due.
        late = T0 + 3 * SECOND
        self.assertEqual(self.decide(row(), now=late, firing=late), Run(T0, claim=True))

    def test_a_fire_time_claimed_elsewhere_is_not_run(self):
        decision = self.decide(row(last_fire_time=T0))
        self.assertEqual(decision, Skip("already run", next_time=T0 + 10 * SECOND))

    def test_a_paused_task_serves_the_fire_time_without_running(self):
        stored = TaskRow(TriggerState(anchor=T0), True, trigger=DESCRIBED)
        self.assertEqual(self.decide(stored), Skip("paused", claim=T0))

    def test_another_deployment_s_trigger_is_never_run(self):
        stored = row(trigger="every 1h")
        self.assertEqual(self.decide(stored), Skip(TRIGGER_CHANGED))

    def test_a_run_request_runs_once_while_it_is_in_the_row(self):
        asked = T0 - SECOND
        request = RunRequest(requested_at=asked)
        self.assertEqual(
            self.decide(row(run_requested_at=asked), firing=request), Run(None, request=request)
        )
        self.assertEqual(self.decide(row(), firing=request), Skip("already run"))
        # A newer request is another request: this one was taken.
        newer = row(run_requested_at=T0)
        self.assertEqual(self.decide(newer, firing=request), Skip("already run"))

    def test_a_run_request_ignores_the_trigger_of_the_row(self):
        request = RunRequest()
        stored = row(trigger="every 1h")
        self.assertEqual(self.decide(stored, firing=request), Run(None, request=request))

    def test_a_recovery_reruns_the_lost_fire_time_once(self):
        request = RunRequest(recover_run_id=7)
        lost = T0 - 10 * SECOND
        stored = row(recover_run_id=7, recover_fire_time=lost)
        self.assertEqual(self.decide(stored, firing=request), Run(lost, request=request))
        self.assertEqual(self.decide(row(), firing=request), Skip("already recovered"))
