"""LockConfiguration validates itself (ShedLock's LockConfigurationTest, F1-F3)."""

from __future__ import annotations

import dataclasses
import pickle
from datetime import timedelta

from django.test import SimpleTestCase

from django_scheduling.conf import NAME_LENGTH
from django_scheduling.locking import LockConfiguration


class LockConfigurationTests(SimpleTestCase):
    def test_durations_are_normalised_to_timedelta(self) -> None:
        for most, least in (
            ("10m", "30s"),
            (600, 30.0),
            ("PT10M", "PT30S"),
            (timedelta(minutes=10), timedelta(seconds=30)),
        ):
            with self.subTest(most=most, least=least):
                config = LockConfiguration("report", most, least)
                self.assertEqual(config.lock_at_most_for, timedelta(minutes=10))
                self.assertEqual(config.lock_at_least_for, timedelta(seconds=30))

    def test_lock_at_least_for_defaults_to_zero(self) -> None:
        self.assertEqual(LockConfiguration("report", "1s").lock_at_least_for, timedelta(0))

    def test_zero_and_tiny_durations_are_valid(self) -> None:
        """F1: (0, 0) and (1 ms, 0) are valid."""
        self.assertEqual(LockConfiguration("a", 0, 0).lock_at_most_for, timedelta(0))
        self.assertEqual(LockConfiguration("a", "1ms").lock_at_most_for, timedelta(milliseconds=1))
        self.assertEqual(LockConfiguration("a", "1s", "1s").lock_at_least_for, timedelta(seconds=1))

    def test_lock_at_least_for_may_not_exceed_lock_at_most_for(self) -> None:
        """F1: (0, 1 ms) is refused, with both values and the name in the message."""
        with self.assertRaisesMessage(
            ValueError, "lock_at_least_for (1ms) exceeds lock_at_most_for (0s) for 'a'"
        ):
            LockConfiguration("a", 0, "1ms")
        with self.assertRaisesMessage(
            ValueError, "lock_at_least_for (5s) exceeds lock_at_most_for (1s) for 'name'"
        ):
            LockConfiguration("name", "1s", "5s")

    def test_negative_durations_are_refused(self) -> None:
        """F2: lock_at_most_for = -1 s is refused."""
        with self.assertRaisesMessage(
            ValueError, "lock_at_most_for of 'a' must not be negative, got -1"
        ):
            LockConfiguration("a", -1)
        with self.assertRaisesMessage(
            ValueError,
            "lock_at_least_for of 'a' must not be negative, got datetime.timedelta(days=-1",
        ):
            LockConfiguration("a", "1s", timedelta(seconds=-1))

    def test_unreadable_duration_is_refused(self) -> None:
        with self.assertRaisesMessage(ValueError, "invalid lock_at_most_for of 'a' 'soon'"):
            LockConfiguration("a", "soon")

    def test_empty_or_blank_name_is_refused(self) -> None:
        """F3: an empty name is refused."""
        for name in ("", "   ", None, 42):
            with self.subTest(name=name):
                with self.assertRaisesMessage(
                    ValueError, f"A lock name must be a non-empty string, got {name!r}"
                ):
                    LockConfiguration(name, "1s")  # type: ignore[arg-type]

    def test_name_with_surrounding_whitespace_is_refused(self) -> None:
        with self.assertRaisesMessage(
            ValueError, "The lock name ' a' starts or ends with whitespace"
        ):
            LockConfiguration(" a", "1s")

    def test_name_longer_than_the_column_is_refused(self) -> None:
        self.assertEqual(LockConfiguration("x" * NAME_LENGTH, "1s").name, "x" * NAME_LENGTH)
        with self.assertRaisesMessage(
            ValueError, f"is {NAME_LENGTH + 1} characters long; the limit is {NAME_LENGTH}"
        ):
            LockConfiguration("x" * (NAME_LENGTH + 1), "1s")

    def test_is_frozen_and_hashable(self) -> None:
        config = LockConfiguration("a", "1s")
        with self.assertRaises(dataclasses.FrozenInstanceError):
            config.name = "b"  # type: ignore[misc]
        self.assertEqual(config, LockConfiguration("a", 1))
        self.assertEqual(len({config, LockConfiguration("a", "1000ms")}), 1)

    def test_pickles(self) -> None:
        config = LockConfiguration("a", "10s", "5s")
        self.assertEqual(pickle.loads(pickle.dumps(config)), config)

    def test_replace_validates_again(self) -> None:
        config = LockConfiguration("a", "10s", "5s")
        self.assertEqual(
            dataclasses.replace(config, lock_at_most_for="20s").lock_at_most_for,
            timedelta(seconds=20),
        )
        with self.assertRaisesMessage(ValueError, "exceeds lock_at_most_for (1s)"):
            dataclasses.replace(config, lock_at_most_for="1s")
