"""What every lock provider shares: the configuration, the handle, the base class and the
errors.

A provider's ``lock(config)`` returns a ``Lock`` handle, or ``None`` when the lock is held
elsewhere: losing the race is a normal outcome. Failures of the storage raise ``LockError``.

The scheduler takes and releases the locks of firings due together in batches
(``lock_many``, ``unlock_many``). ``BaseLockProvider`` does that one lock at a time, right
away; a provider that can do it in the caller's database transaction, so that the locks of a
batch take effect with the claims of their fire times or not at all, says so with
``supports_batches = True`` (the database provider).
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import ClassVar, Protocol, runtime_checkable

from ..conf import NAME_LENGTH
from ..schedules.durations import DurationLike, format_duration, parse_duration

__all__ = [
    "BaseLockProvider",
    "InvalidLockHandle",
    "Lock",
    "LockConfiguration",
    "LockError",
    "LockProvider",
]


class LockError(Exception):
    """The lock storage failed (database down, table missing, value too long...).

    ``released``: the names of the locks that a release of many (``unlock_many``) without a
    transaction had settled before it failed (released, or found no longer held): they are
    not to be released again.
    """

    released: frozenset[str] = frozenset()


class InvalidLockHandle(RuntimeError):
    """A lock handle was used after it was unlocked or extended."""


@dataclass(frozen=True, slots=True)
class LockConfiguration:
    """What to lock and for how long.

    ``lock_at_most_for`` bounds how long the lock is held if its holder dies without unlocking;
    ``lock_at_least_for`` keeps it held after an early unlock, which absorbs clock differences
    between instances. Both accept anything ``parse_duration`` reads.
    """

    name: str
    lock_at_most_for: timedelta
    lock_at_least_for: timedelta = timedelta(0)

    def __init__(
        self, name: str, lock_at_most_for: DurationLike, lock_at_least_for: DurationLike = 0
    ) -> None:
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "lock_at_most_for", lock_at_most_for)
        object.__setattr__(self, "lock_at_least_for", lock_at_least_for)
        self.__post_init__()

    def __post_init__(self) -> None:
        name = self.name
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"A lock name must be a non-empty string, got {name!r}")
        if name != name.strip():
            # MySQL's PAD SPACE collations would treat 'x' and 'x ' as the same lock.
            raise ValueError(f"The lock name {name!r} starts or ends with whitespace; remove it")
        if len(name) > NAME_LENGTH:
            raise ValueError(
                f"The lock name {name[:40]!r}... is {len(name)} characters long; "
                f"the limit is {NAME_LENGTH}"
            )
        most = _duration(self.lock_at_most_for, "lock_at_most_for", name)
        least = _duration(self.lock_at_least_for, "lock_at_least_for", name)
        if least > most:
            raise ValueError(
                f"lock_at_least_for ({format_duration(least)}) exceeds lock_at_most_for "
                f"({format_duration(most)}) for {name!r}"
            )
        object.__setattr__(self, "lock_at_most_for", most)
        object.__setattr__(self, "lock_at_least_for", least)

    def _renamed(self, name: str) -> LockConfiguration:
        """Return this configuration for the lock *name*, without the checks of the
        constructor: for a name read from a configuration that passed them (``Lock._named``
        makes a handle per firing of a burst from its batch's handle)."""
        config = object.__new__(LockConfiguration)
        object.__setattr__(config, "name", name)
        object.__setattr__(config, "lock_at_most_for", self.lock_at_most_for)
        object.__setattr__(config, "lock_at_least_for", self.lock_at_least_for)
        return config


def _duration(value: DurationLike, option: str, name: str) -> timedelta:
    # The scheduler builds a configuration per locked firing, from timedeltas already read.
    if isinstance(value, timedelta) and value >= timedelta(0):
        return value
    return parse_duration(value, name=f"{option} of {name!r}")


class Lock:
    """A held lock: a single-use handle, spent by ``unlock()`` or ``extend()``.

    ``locked_at`` is when the lock was acquired and ``lock_until`` when it expires, both aware
    UTC and by the clock of the provider (the database server's on MySQL and PostgreSQL).
    Providers subclass
    this and implement ``_unlock()`` and ``_extend()``.
    """

    # Slotted (a subclass without __slots__ still gets a __dict__): a burst claimed ahead of its
    # instant holds thousands of locks at once.
    __slots__ = ("_least_until", "_valid", "config", "lock_until", "locked_at")

    def __init__(
        self,
        config: LockConfiguration,
        *,
        locked_at: datetime,
        lock_until: datetime,
        least_until: datetime | None = None,
    ) -> None:
        self.config = config
        self.locked_at = locked_at
        self.lock_until = lock_until
        # lock_at_least_for counts from the acquisition, or from the extend that made this handle.
        least = config.lock_at_least_for
        self._least_until = least_until or (locked_at + least if least else locked_at)
        self._valid = True

    def __repr__(self) -> str:
        state = "valid" if self._valid else "spent"
        return f"<{type(self).__name__} {self.config.name!r} until {self.lock_until} ({state})>"

    @property
    def valid(self) -> bool:
        """Return whether ``unlock()`` and ``extend()`` may still be called (not whether the
        lock has expired)."""
        return self._valid

    def _check_valid(self) -> None:
        if not self._valid:
            raise InvalidLockHandle(
                f"lock {self.config.name!r} is no longer valid: it was already unlocked or extended"
            )

    def unlock(self) -> bool:
        """Release the lock, but not before ``lock_at_least_for`` has passed.

        Return ``True`` if this handle released the lock, ``False`` if the lock was no longer
        this handle's: it expired and was taken again (by any instance, this one included), so
        nothing was released and the holders' runs may have overlapped; the provider logs a
        warning. Raise ``InvalidLockHandle`` if this handle was already spent, ``LockError``
        (leaving the handle usable) if the storage fails.
        """
        self._check_valid()
        released = self._unlock()
        self._valid = False
        return released

    def extend(
        self, lock_at_most_for: DurationLike, lock_at_least_for: DurationLike = 0
    ) -> Lock | None:
        """Hold the lock for *lock_at_most_for* from now and return a new handle.

        Return ``None`` if the lock is no longer held by this handle (for example it expired);
        the expiry is then left as it was. This handle is spent either way.
        """
        self._check_valid()
        config = LockConfiguration(self.config.name, lock_at_most_for, lock_at_least_for)
        extended = self._extend(config)
        self._valid = False
        return extended

    def _shared(self) -> Hashable | None:
        """Return what this handle shares with the handles taken with it, or ``None`` (the
        default) for a handle with state of its own (a token). Handles with equal keys differ
        only in their lock's name, and ``_named()`` makes one from another: a batch of firings
        keeps one handle per key, not one per firing, and its locks are released by name
        (``unlock_many(..., by_name=...)``)."""
        return None

    def _named(self, name: str) -> Lock:
        """Return a handle like this one for the lock *name* (see ``_shared()``)."""
        raise NotImplementedError

    def _unlock(self) -> bool:
        """Release the lock if this handle's acquisition still holds it; return whether it
        did."""
        raise NotImplementedError

    def _extend(self, config: LockConfiguration) -> Lock | None:
        raise NotImplementedError


@runtime_checkable
class LockProvider(Protocol):
    """Something that can take a named lock shared by every instance that uses it."""

    def lock(self, config: LockConfiguration) -> Lock | None:
        """Return a held ``Lock``, or ``None`` if the lock is held elsewhere.

        Raise ``LockError`` if the storage fails.
        """
        ...


class BaseLockProvider:
    """The base of the lock providers the scheduler uses (``SCHEDULING['LOCK_PROVIDER']``): a
    provider implements ``lock()``; the batch verbs default to one lock at a time.

    ``supports_batches``: whether ``lock_many(..., joined=True)`` and
    ``unlock_many(..., joined=True)`` run in the caller's database transaction and take
    effect when it commits. Without it they take effect at once, and the scheduler releases
    the locks of a batch whose transaction rolled back.
    """

    supports_batches: ClassVar[bool] = False

    def lock(self, config: LockConfiguration) -> Lock | None:
        raise NotImplementedError

    def lock_many(
        self,
        configs: list[LockConfiguration],
        *,
        now: datetime | None = None,
        absent: Collection[str] = (),
        joined: bool = False,
    ) -> dict[str, Lock]:
        """Take every lock of *configs* that is free and return them by name (*now*, *absent*
        and *joined* are hints a provider may use; here they are not)."""
        taken = {}
        for config in sorted(configs, key=lambda config: config.name):
            lock = self.lock(config)
            if lock is not None:
                taken[config.name] = lock
        return taken

    def unlock_many(
        self,
        locks: list[Lock],
        *,
        joined: bool = False,
        by_name: Mapping[Lock, list[str]] | None = None,
    ) -> set[str]:
        """Release *locks*, and the locks *by_name* names under the handle each was taken
        with (handles that share all but their name, see ``Lock._shared()``: a batch keeps
        one); return the names of those no longer held by their handle."""
        if by_name:
            locks = [*locks, *named_handles(by_name)]
        return {lock.config.name for lock in locks if lock.unlock() is False}


def named_handles(by_name: Mapping[Lock, list[str]], skip: Collection[str] = ()) -> list[Lock]:
    """Return a handle for each lock that *by_name* names under the handle it was taken with
    (see ``Lock._named()``), but for those in *skip*: for a provider, or a path, that releases
    locks one handle at a time."""
    return [
        handle._named(name)
        for handle, names in by_name.items()
        for name in names
        if name not in skip
    ]
