"""The run signals: sent from many worker threads at once without queueing on a lock of the
whole signal, and still to exactly the receivers connected (for every sender, or for one)."""

from __future__ import annotations

import gc
import threading

from django.test import SimpleTestCase

from django_scheduling import signals


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
