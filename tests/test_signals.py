"""The run signals: sent from many threads at once without queueing on a lock of the whole
signal, and still to exactly the receivers connected (for every sender, or for one); and the
fan-out of run events that sends them."""

from __future__ import annotations

import gc
import threading

import pytest
from django.conf import settings
from django.db import connections
from django.test import SimpleTestCase

from django_scheduling import signals
from django_scheduling.observability.events import RunEvents
from django_scheduling.signals import _RunSignal


class RunSignalTests(SimpleTestCase):
    def setUp(self) -> None:
        self.signal = signals.run_skipped.__class__()
        self.calls: list[tuple[str, str]] = []

    def receiver(self, name: str):
        def receive(sender: str, **kwargs: object) -> None:
            self.calls.append((name, sender))

        # Kept alive by the test: the signal holds its receivers weakly.
        self.addCleanup(lambda: receive)
        return receive

    def test_a_send_does_not_wait_for_the_signals_lock(self):
        self.signal.connect(self.receiver("every"))
        self.signal.send("task.a")  # the receivers are looked up once
        sent = threading.Event()

        def send() -> None:
            self.signal.send("task.b")
            sent.set()

        with self.signal.lock:
            thread = threading.Thread(target=send)
            thread.start()
            self.assertTrue(sent.wait(10), "the send waited for the signal's lock")
        thread.join()
        self.assertEqual(self.calls, [("every", "task.a"), ("every", "task.b")])

    def test_receivers_connected_and_disconnected_after_a_send_are_seen(self):
        first = self.receiver("first")
        self.signal.connect(first)
        self.signal.send("task.a")
        self.signal.connect(self.receiver("second"))
        self.signal.send("task.b")
        self.signal.disconnect(first)
        self.signal.send("task.c")
        self.assertEqual(
            self.calls,
            [("first", "task.a"), ("first", "task.b"), ("second", "task.b"), ("second", "task.c")],
        )

    def test_a_receiver_for_one_sender_gets_only_that_senders_sends(self):
        self.signal.connect(self.receiver("every"))
        self.signal.send("task.a")
        self.signal.connect(self.receiver("only b"), sender="task.b")
        for sender in ("task.a", "task.b", "task.a"):
            self.signal.send(sender)
        self.assertEqual(
            self.calls,
            [
                ("every", "task.a"),
                ("every", "task.a"),
                ("every", "task.b"),
                ("only b", "task.b"),
                ("every", "task.a"),
            ],
        )

    def test_a_receiver_that_was_collected_is_not_called(self):
        def gone(sender: str, **kwargs: object) -> None:
            self.calls.append(("gone", sender))

        self.signal.connect(gone)
        self.signal.send("task.a")
        del gone
        gc.collect()
        self.signal.send("task.b")
        self.assertEqual(self.calls, [("gone", "task.a")])

    def test_a_receiver_connected_after_a_send_to_none_is_called(self):
        self.assertEqual(self.signal.send("task.a"), [])
        self.signal.connect(self.receiver("late"))
        self.signal.send("task.a")
        self.assertEqual(self.calls, [("late", "task.a")])


class RunEventsTests(SimpleTestCase):
    """The fan-out of run events: observers and receivers that fail hurt nothing else."""

    databases = {"default"}  # one test's observer queries, on the events thread

    def setUp(self) -> None:
        self.events = RunEvents(name="test-events")
        self.signal = _RunSignal()
        self.seen: list[str] = []

    def test_observers_then_receivers_in_order_on_a_thread_of_their_own(self):
        threads = set()

        def observer(sender, **kwargs):
            threads.add(threading.current_thread().name)
            self.seen.append(f"observer {sender} {kwargs['n']}")

        def receiver(sender, **kwargs):
            self.seen.append(f"receiver {sender} {kwargs['n']}")

        self.events.subscribe(self.signal, observer)
        self.events.subscribe(self.signal, observer)  # once is enough
        self.signal.connect(receiver, weak=False)
        for n in (1, 2):
            self.events.publish(self.signal, "task", n=n)
        self.assertTrue(self.events.drain(10))
        self.assertEqual(
            self.seen, ["observer task 1", "receiver task 1", "observer task 2", "receiver task 2"]
        )
        self.assertEqual(threads, {"test-events"})

    def test_an_observer_or_a_receiver_that_raises_hurts_nothing(self):
        def broken_observer(sender, **kwargs):
            raise RuntimeError("observer")

        def exiting_receiver(sender, **kwargs):
            raise SystemExit(3)  # not an Exception: send_robust lets it through

        def raising_receiver(sender, **kwargs):
            raise ValueError("receiver")

        def good_receiver(sender, **kwargs):
            self.seen.append(kwargs["n"])

        self.events.subscribe(self.signal, broken_observer)
        self.signal.connect(raising_receiver, weak=False)
        self.signal.connect(good_receiver, weak=False)
        with self.assertLogs("django_scheduling.observability.events", "ERROR") as logs:
            self.events.publish(self.signal, "task", n=1)
            self.assertTrue(self.events.drain(10))
        self.assertEqual(self.seen, [1])  # the observer's failure stopped nothing
        self.assertIn("The observer", logs.output[0])

        self.signal.connect(exiting_receiver, weak=False)
        with self.assertLogs("django_scheduling.observability.events", "ERROR"):
            self.events.publish(self.signal, "task", n=2)
            self.assertTrue(self.events.drain(10))
        self.events.publish(self.signal, "task", n=3)
        self.assertTrue(self.events.drain(10))
        # SystemExit stopped the receivers after it for that event, not the thread.
        self.assertIn(3, self.seen)

    def test_an_observer_is_asked_whether_it_listens_once_and_again_after_a_settings_change(self):
        # Asking for each event read the settings per observer, a system call each. (The
        # events thread asks too, once for each lot of events it takes: not counted here.)
        asked = []
        publisher = threading.current_thread()

        def active():
            if threading.current_thread() is publisher:
                asked.append(True)
            return getattr(settings, "OBSERVER_ON", False)

        def observer(sender, **kwargs):
            self.seen.append(kwargs["n"])

        self.events.subscribe(self.signal, observer, active)
        for n in (1, 2, 3):
            self.events.publish(self.signal, "task", n=n)
        with self.settings(OBSERVER_ON=True):
            for n in (4, 5):
                self.events.publish(self.signal, "task", n=n)
            self.assertTrue(self.events.drain(10))
        self.events.publish(self.signal, "task", n=6)
        self.assertTrue(self.events.drain(10))
        self.assertEqual(self.seen, [4, 5])
        self.assertEqual(len(asked), 3)  # once before the change, once in it, once after

    @pytest.mark.vendor("postgresql", "mysql")  # Django never closes an in-memory SQLite one
    def test_the_thread_lets_its_database_connection_go_after_a_delivery(self):
        # It lives as long as the process: a connection an observer opened must not stay open
        # with it (CONN_MAX_AGE is 0 in the tests, as by default).
        seen = []

        def queries(sender, **kwargs):
            with connections["default"].cursor() as cursor:
                cursor.execute("SELECT 1")
            seen.append(connections["default"].connection is not None)

        def looks(sender, **kwargs):
            seen.append(connections["default"].connection is not None)

        self.events.subscribe(self.signal, queries)
        self.events.publish(self.signal, "task")
        self.assertTrue(self.events.drain(10))
        self.events.unsubscribe(self.signal, queries)
        self.events.subscribe(self.signal, looks)
        self.events.publish(self.signal, "task")
        self.assertTrue(self.events.drain(10))
        self.assertEqual(seen, [True, False])

    def test_an_event_nobody_hears_is_not_queued(self):
        self.events.publish(self.signal, "task")
        self.assertEqual(self.events.pending, 0)
        self.assertIsNone(self.events._thread)
        heard = []
        self.signal.connect(lambda sender, **kwargs: heard.append(sender), weak=False)
        self.events.publish(self.signal, "task")
        self.assertTrue(self.events.drain(10))
        self.assertEqual(heard, ["task"])

    def test_a_thread_that_died_is_started_again(self):
        self.signal.connect(lambda sender, **kwargs: None, weak=False)
        self.events.publish(self.signal, "task")
        self.assertTrue(self.events.drain(10))
        dead = self.events._thread
        assert dead is not None
        self.events._thread = threading.Thread(target=lambda: None)  # one that has ended
        self.events._thread.start()
        self.events._thread.join()
        with self.assertLogs("django_scheduling.observability.events", "ERROR") as logs:
            self.events.publish(self.signal, "task")
        self.assertTrue(self.events.drain(10))
        self.assertIn("had stopped; starting it again", logs.output[0])
