"""Task definitions, the registry, and the ``@scheduled`` decorator.

``@scheduled`` records a ``TaskDefinition`` and returns the function unchanged. A definition
whose options are wrong is recorded with its error instead of raising at import: system checks
(``manage.py check``) report it, and the scheduler refuses to start while any is left.
"""

from __future__ import annotations

import inspect
import json
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, tzinfo
from types import FunctionType, MappingProxyType
from typing import Any, Generic, TypeVar

from . import engines
from .conf import NAME_LENGTH
from .durations import DurationLike, parse_duration
from .triggers import DEFAULT_MISFIRE_THRESHOLD, MissedRuns, Trigger, make_trigger, trigger_key

__all__ = ["TaskDefinition", "TaskRegistry", "registry", "scheduled", "autodiscover"]

logger = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class TaskOptions:
    """The options of a task besides its name, function, trigger and arguments. Immutable, and
    one object for the tasks declared alike (see ``TaskDefinition``)."""

    lock: bool = True
    lock_at_most_for: timedelta | None = None
    lock_at_least_for: timedelta | None = None
    error: str | None = None
    error_field: str | None = None
    #: Run a lost run of this task again, once, on another instance.
    recover: bool = False
    #: Delay each firing by a deterministic offset in [0, jitter); None: the setting's JITTER.
    jitter: timedelta | None = None
    #: ``engines.DJANGO_TASKS`` or ``engines.CELERY`` when each firing enqueues *func*.
    engine: str | None = None
    #: Celery only: how long a message may wait for a worker; None: until the next fire time;
    #: False: forever.
    expires: timedelta | bool | None = None


class _Option(Generic[T]):
    """A task's option, read from its ``TaskOptions`` as if it were the definition's own."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, definition: TaskDefinition | None, owner: type | None = None) -> T:
        if definition is None:
            return self  # type: ignore[return-value]  # looked up on the class
        value: T = getattr(definition.options, self.name)
        return value


@dataclass(frozen=True, slots=True)
class TaskDefinition:
    """A task as declared in code: the function (or the django.tasks / Celery task that each
    firing enqueues), its trigger options, the arguments of each call and its other options.

    One per task for as long as the process runs: what tasks declared alike have in common
    (the trigger's options, ``options``) is one object shared by them all.
    """

    name: str
    func: Any
    #: The trigger's options as declared; one dict is shared by the tasks declared alike, so
    #: it is read, never changed.
    trigger_options: dict[str, Any] = field(hash=False)
    #: The arguments of each call (or enqueue).
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict, hash=False)
    options: TaskOptions = TaskOptions()

    lock = _Option[bool]()
    lock_at_most_for = _Option[timedelta | None]()
    lock_at_least_for = _Option[timedelta | None]()
    error = _Option[str | None]()
    error_field = _Option[str | None]()
    recover = _Option[bool]()
    jitter = _Option[timedelta | None]()
    engine = _Option[str | None]()
    expires = _Option[timedelta | bool | None]()

    @property
    def is_async(self) -> bool:
        return self.engine is None and inspect.iscoroutinefunction(self.func)

    @property
    def origin(self) -> str:
        return _origin(self.func, self.engine)

    def trigger(
        self, default_zone: tzinfo, misfire_threshold: timedelta = DEFAULT_MISFIRE_THRESHOLD
    ) -> Trigger:
        """Return this task's trigger; a cron task without ``zone=`` uses *default_zone*.

        Tasks declared alike get the same trigger object: triggers are immutable.
        """
        return make_trigger(
            **self.trigger_options,
            default_zone=default_zone,
            misfire_threshold=misfire_threshold,
        )


def _origin(func: Any, engine: str | None) -> str:
    """Return the dotted path of the function behind *func* (a task object's own class lives
    in ``django.tasks.base`` or ``celery.local``, which says nothing of the task)."""
    function = engines.function_of(func, engine)
    if function is None:
        return f"{engine} task {getattr(func, 'name', '?')}"
    return f"{function.__module__}.{function.__qualname__}"


#: The keyword arguments of the tasks called without any; read-only, as it is shared.
_NO_KWARGS: Mapping[str, Any] = MappingProxyType({})


def _definition(func: Any, name: str | None, **options: Any) -> TaskDefinition:
    engine = engines.engine_of(func)
    args, kwargs, expires = options.pop("args"), options.pop("kwargs"), options.pop("expires")
    lock = options.pop("lock")
    recover = options.pop("recover")
    jitter = options.pop("jitter")
    most, least = options.pop("lock_at_most_for"), options.pop("lock_at_least_for")
    trigger_options = _shared({key: value for key, value in options.items() if value is not None})
    task_name = name if name is not None else _origin(func, engine)
    calls: dict[str, Any] = {"engine": engine}
    try:
        if engine is None and not callable(func):
            raise _Invalid("function", f"{func!r} is not callable")
        if not isinstance(task_name, str) or not task_name.strip():
            raise _Invalid("name", f"task name {task_name!r} is empty; give name='...'")
        if len(task_name) > NAME_LENGTH:
            raise _Invalid(
                "name",
                f"task name {task_name!r} is {len(task_name)} characters long; the limit is "
                f"{NAME_LENGTH}: give a shorter name='...'",
            )
        if not isinstance(lock, bool):
            raise _Invalid("lock", f"lock={lock!r} must be True or False")
        if not isinstance(recover, bool):
            raise _Invalid("recover", f"recover={recover!r} must be True or False")
        if engine is not None and not lock:
            raise _Invalid(
                "lock",
                "lock=False on a task that is enqueued would enqueue each firing once per "
                "scheduler instance; drop lock=False",
            )
        if recover and not lock:
            raise _Invalid(
                "recover",
                "recover=True needs lock=True: a lost run is told by its lock; drop recover=True",
            )
        try:
            make_trigger(**trigger_options)
        except ValueError as exc:
            raise _Invalid("trigger", str(exc)) from None
        try:
            most_td = (
                None
                if most is None
                else parse_duration(most, name="lock_at_most_for", allow_zero=False)
            )
            least_td = None if least is None else parse_duration(least, name="lock_at_least_for")
        except ValueError as exc:
            raise _Invalid("lock", str(exc)) from None
        try:
            jitter_td = None if jitter is None else parse_duration(jitter, name="jitter")
        except ValueError as exc:
            raise _Invalid("trigger", str(exc)) from None
        if not lock and (most is not None or least is not None):
            raise _Invalid(
                "lock", "lock_at_most_for= and lock_at_least_for= need lock=True; drop them"
            )
        if most_td is not None and least_td is not None and least_td > most_td:
            raise _Invalid(
                "lock",
                f"lock_at_least_for ({least!r}) exceeds lock_at_most_for ({most!r}); "
                "lower lock_at_least_for",
            )
        calls.update(_calls(func, engine, args, kwargs, expires))
    except _Invalid as exc:
        return _defined(
            task_name,
            func,
            trigger_options,
            lock=lock,
            error=exc.message,
            error_field=exc.field,
            engine=engine,
        )
    return _defined(
        task_name,
        func,
        trigger_options,
        lock=lock,
        lock_at_most_for=most_td,
        lock_at_least_for=least_td,
        recover=recover,
        jitter=jitter_td,
        **calls,
    )


def _defined(
    name: str,
    func: Any,
    trigger_options: dict[str, Any],
    *,
    args: tuple[Any, ...] = (),
    kwargs: Mapping[str, Any] = _NO_KWARGS,
    **options: Any,
) -> TaskDefinition:
    """Return the definition of a task, with the options object of the tasks declared alike."""
    wanted = TaskOptions(**options)
    return TaskDefinition(name, func, trigger_options, args, kwargs, _kept(wanted, wanted))


def _calls(
    func: Any,
    engine: str | None,
    args: Any,
    kwargs: Any,
    expires: DurationLike | bool | None,
) -> dict[str, Any]:
    """Check the arguments of each call and ``expires=``; return them as the definition's."""
    if not isinstance(args, tuple | list):
        raise _Invalid("function", f"args={args!r} must be a tuple or a list")
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, Mapping) or not all(isinstance(key, str) for key in kwargs):
        raise _Invalid("function", f"kwargs={kwargs!r} must be a dict with string keys")
    if engine == engines.CELERY or getattr(func, "takes_context", False):
        # The engine passes the task (bind=True) or its context first: nothing to compare.
        function = None
    else:
        function = engines.function_of(func, engine)
    if engine is None and not args and not kwargs:
        required = _required_parameters(func)
        if required:
            raise _Invalid(
                "function",
                f"the function needs the argument(s) {', '.join(required)}, but a task is "
                "called with none; give them with args=(...) or kwargs={...}",
            )
    elif function is not None:
        try:
            inspect.signature(function).bind(*args, **kwargs)
        except TypeError as exc:
            raise _Invalid(
                "function",
                f"args={tuple(args)!r} and kwargs={dict(kwargs)!r} do not fit the function "
                f"{function.__qualname__}: {exc}",
            ) from None
        except ValueError:  # some built-ins have no signature to read
            pass
    if engine == engines.DJANGO_TASKS:
        try:  # what the backend stores: refused at each firing, so found here
            json.dumps([list(args), dict(kwargs)])
        except (TypeError, ValueError) as exc:
            raise _Invalid(
                "function",
                f"args={tuple(args)!r} and kwargs={dict(kwargs)!r} cannot be enqueued: a "
                f"django.tasks Task takes JSON values ({exc}); give strings, numbers, "
                "booleans, None, lists and dicts",
            ) from None
    expires_td: timedelta | bool | None = None
    if expires is not None and expires is not False:
        if engine != engines.CELERY:
            raise _Invalid(
                "function",
                f"expires={expires!r} applies to Celery tasks only; drop it (django.tasks has "
                "no expiry)",
            )
        if expires is True:
            raise _Invalid("function", "expires=True is not a duration; give e.g. expires='5m'")
        try:
            expires_td = parse_duration(expires, name="expires", allow_zero=False)
        except ValueError as exc:
            raise _Invalid("function", str(exc)) from None
    elif expires is False:
        expires_td = False
    # No arguments (the usual case): every task shares one empty mapping.
    return {
        "args": tuple(args),
        "kwargs": dict(kwargs) if kwargs else _NO_KWARGS,
        "expires": expires_td,
    }


#: What the tasks declared so far have in common, kept once per distinct value: their trigger
#: options (a dict) and their other options (a ``TaskOptions``), by key.
_kept_values: dict[object, Any] = {}
_KEPT_SIZE = 1024


def _kept(key: object, value: Any) -> Any:
    """Return the value that earlier tasks hold under *key*, if any, else *value*: ten
    thousand tasks declared alike keep one."""
    shared = _kept_values.get(key)
    if shared is None:
        if len(_kept_values) >= _KEPT_SIZE:
            _kept_values.clear()  # the tasks keep the values they hold
        shared = _kept_values.setdefault(key, value)
    return shared


def _shared(options: dict[str, Any]) -> dict[str, Any]:
    """Return the dict of trigger options equal to *options* that earlier tasks hold, if any."""
    key = trigger_key(**options)
    if key is None:
        return options
    shared: dict[str, Any] = _kept(key, options)
    return shared


#: Attributes that make ``inspect.signature()`` read more than the function's code.
_SIGNATURE_ATTRIBUTES = ("__wrapped__", "__signature__", "_partialmethod")


def _required_parameters(func: Callable[..., Any]) -> list[str]:
    """Return the names of the parameters that a call without arguments leaves unfilled."""
    if type(func) is FunctionType and not any(hasattr(func, a) for a in _SIGNATURE_ATTRIBUTES):
        # What inspect.signature() would say, read from the code: the signature would give
        # every task's function an __annotations__ dict for the life of the process.
        code = func.__code__
        positional = code.co_varnames[: code.co_argcount]
        keyword_only = code.co_varnames[
            code.co_argcount : code.co_argcount + code.co_kwonlyargcount
        ]
        defaults = func.__kwdefaults__ or {}
        required = positional[: len(positional) - len(func.__defaults__ or ())]
        return [*required, *(name for name in keyword_only if name not in defaults)]
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):  # some built-ins have no signature to read
        return []
    unfilled = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    return [
        parameter.name
        for parameter in signature.parameters.values()
        if parameter.kind not in unfilled and parameter.default is inspect.Parameter.empty
    ]


class _Invalid(Exception):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


class TaskRegistry:
    """The tasks declared in code, by name."""

    def __init__(self) -> None:
        self._tasks: dict[str, TaskDefinition] = {}
        self.duplicates: list[tuple[TaskDefinition, TaskDefinition]] = []

    def add(
        self,
        func: Any,
        *,
        cron: str | None = None,
        zone: str | tzinfo | None = None,
        fixed_rate: DurationLike | None = None,
        fixed_delay: DurationLike | None = None,
        initial_delay: DurationLike | None = None,
        at: datetime | None = None,
        missed: MissedRuns | str = MissedRuns.COALESCE,
        name: str | None = None,
        lock: bool = True,
        lock_at_most_for: DurationLike | None = None,
        lock_at_least_for: DurationLike | None = None,
        recover: bool = False,
        jitter: DurationLike | None = None,
        args: tuple[Any, ...] | list[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        expires: DurationLike | bool | None = None,
    ) -> TaskDefinition:
        """Record *func* as a task and return its definition."""
        definition = _definition(
            func,
            name,
            cron=cron,
            zone=zone,
            fixed_rate=fixed_rate,
            fixed_delay=fixed_delay,
            initial_delay=initial_delay,
            at=at,
            missed=None if missed == MissedRuns.COALESCE else missed,
            lock=lock,
            lock_at_most_for=lock_at_most_for,
            lock_at_least_for=lock_at_least_for,
            recover=recover,
            jitter=jitter,
            args=args,
            kwargs=kwargs,
            expires=expires,
        )
        existing = self._tasks.get(definition.name)
        # The same name from another function, or twice on one function with other options
        # (two @scheduled lines without distinct names); the same declaration again (a module
        # imported once more) replaces its definition.
        if existing is not None and (
            existing.origin != definition.origin
            or (existing.func is definition.func and existing != definition)
        ):
            self.duplicates.append((existing, definition))
        else:
            self._tasks[definition.name] = definition
        return definition

    def __iter__(self) -> Iterator[TaskDefinition]:
        return iter(sorted(self._tasks.values(), key=lambda d: d.name))

    def __len__(self) -> int:
        return len(self._tasks)

    def __contains__(self, name: object) -> bool:
        return name in self._tasks

    def get(self, name: str) -> TaskDefinition:
        return self._tasks[name]

    def errors(self) -> list[str]:
        """Return one line per mistake in the declared tasks; empty when all is well."""
        lines = [f"task {d.name!r} ({d.origin}): {d.error}" for d in self if d.error]
        lines += [
            f"two tasks are named {second.name!r}: {first.origin} and {second.origin}; "
            "give one of them another name='...'"
            for first, second in self.duplicates
        ]
        return lines


registry = TaskRegistry()


def scheduled(
    *,
    cron: str | None = None,
    zone: str | tzinfo | None = None,
    fixed_rate: DurationLike | None = None,
    fixed_delay: DurationLike | None = None,
    initial_delay: DurationLike | None = None,
    at: datetime | None = None,
    missed: MissedRuns | str = MissedRuns.COALESCE,
    name: str | None = None,
    lock: bool = True,
    lock_at_most_for: DurationLike | None = None,
    lock_at_least_for: DurationLike | None = None,
    recover: bool = False,
    jitter: DurationLike | None = None,
    args: tuple[Any, ...] | list[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    expires: DurationLike | bool | None = None,
) -> Callable[[F], F]:
    """Declare the decorated function a scheduled task and return it unchanged.

    Give exactly one trigger: ``cron=`` (with an optional ``zone=``), ``fixed_rate=``,
    ``fixed_delay=`` (both with an optional ``initial_delay=``) or ``at=`` (one shot).
    ``args=`` and ``kwargs=`` are the arguments of each call. On a django.tasks ``Task`` or a
    Celery task, each firing enqueues the task instead of calling it; ``expires=`` (Celery
    only) bounds how long its message may wait for a worker: by default until the task's next
    fire time, ``False`` for ever. Several ``@scheduled`` lines with distinct ``name=`` give
    one callable several schedules.
    """

    def decorate(func: F) -> F:
        registry.add(
            func,
            cron=cron,
            zone=zone,
            fixed_rate=fixed_rate,
            fixed_delay=fixed_delay,
            initial_delay=initial_delay,
            at=at,
            missed=missed,
            name=name,
            lock=lock,
            lock_at_most_for=lock_at_most_for,
            lock_at_least_for=lock_at_least_for,
            recover=recover,
            jitter=jitter,
            args=args,
            kwargs=kwargs,
            expires=expires,
        )
        return func

    return decorate


def autodiscover() -> None:
    """Import the task module (``SCHEDULING['TASK_MODULE']``) of every installed app."""
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured
    from django.utils.module_loading import autodiscover_modules

    from .conf import DEFAULTS, get_settings

    try:
        module = get_settings().task_module
    except ImproperlyConfigured:
        # The system checks report the setting; discover with what can be read of it.
        raw = getattr(settings, "SCHEDULING", None)
        given = raw.get("TASK_MODULE") if isinstance(raw, Mapping) else None
        module = given if isinstance(given, str) and given else DEFAULTS["TASK_MODULE"]
    autodiscover_modules(module)
