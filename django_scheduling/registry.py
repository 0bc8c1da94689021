"""Task definitions, the registry, and the ``@scheduled`` decorator.

``@scheduled`` records a ``TaskDefinition`` and returns the function unchanged. A definition
whose options are wrong is recorded with its error instead of raising at import: system checks
(``manage.py check``) report it, and the scheduler refuses to start while any is left.
"""

from __future__ import annotations

import difflib
import inspect
import json
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, tzinfo
from types import FunctionType, MappingProxyType
from typing import Any, Generic, TypeVar, overload

from . import engines
from .conf import NAME_LENGTH, SchedulingSettings
from .schedules.durations import DurationLike, parse_duration
from .schedules.triggers import (
    DEFAULT_MISFIRE_THRESHOLD,
    MissedRuns,
    Trigger,
    make_trigger,
    trigger_key,
)

__all__ = [
    "TaskDefinition",
    "TaskRegistry",
    "registry",
    "scheduled",
    "autodiscover",
    "effective_timeout",
]

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
    #: A run longer than this is reported as timed out; None: the setting's TIMEOUT.
    timeout: timedelta | None = None
    #: How many times a failed in-process run is tried again for the same fire time.
    retries: int = 0
    #: The wait before the first retry, doubled for each next one, up to ``retry_backoff_max``.
    retry_backoff: timedelta = timedelta(seconds=1)
    retry_backoff_max: timedelta = timedelta(minutes=10)


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
    timeout = _Option[timedelta | None]()
    retries = _Option[int]()
    retry_backoff = _Option[timedelta]()
    retry_backoff_max = _Option[timedelta]()

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


def effective_timeout(definition: TaskDefinition, conf: SchedulingSettings) -> timedelta | None:
    """Return the timeout of *definition*'s runs: its ``timeout=``, else ``TIMEOUT``, which a
    django.tasks Task does not take (the framework has no time limit)."""
    if definition.timeout is not None:
        return definition.timeout
    return None if definition.engine == engines.DJANGO_TASKS else conf.timeout


def _origin(func: Any, engine: str | None) -> str:
    """Return the dotted path of the function behind *func* (a task object's own class lives
    in ``django.tasks.base`` or ``celery.local``, which says nothing of the task)."""
    function = engines.function_of(func, engine)
    if function is None:
        return f"{engine} task {getattr(func, 'name', '?')}"
    # A callable object has no name of its own: its class names it.
    module = getattr(function, "__module__", None) or type(function).__module__
    qualname = getattr(function, "__qualname__", None) or type(function).__qualname__
    return f"{module}.{qualname}"


#: The keyword arguments of the tasks called without any; read-only, as it is shared.
_NO_KWARGS: Mapping[str, Any] = MappingProxyType({})


#: Every option of ``@scheduled``, with its default. One table, read by the decorator, by
#: ``TaskRegistry.add`` and by the check that names an unknown keyword.
OPTIONS: Mapping[str, Any] = MappingProxyType(
    {
        "cron": None,
        "zone": None,
        "fixed_rate": None,
        "fixed_delay": None,
        "initial_delay": None,
        "at": None,
        "missed": MissedRuns.COALESCE,
        "name": None,
        "lock": True,
        "lock_at_most_for": None,
        "lock_at_least_for": None,
        "recover": False,
        "jitter": None,
        "args": (),
        "kwargs": None,
        "expires": None,
        "timeout": None,
        "retries": 0,
        "retry_backoff": None,
        "retry_backoff_max": None,
    }
)
#: Keywords that users of other schedulers reach for, and the option each one means.
_ALIASES = {
    "timezone": "zone",
    "time_zone": "zone",
    "tz": "zone",
    "every": "fixed_rate",
    "interval": "fixed_rate",
    "rate": "fixed_rate",
    "period": "fixed_rate",
    "delay": "fixed_delay",
    "schedule": "cron",
    "crontab": "cron",
    "initial": "initial_delay",
    "when": "at",
    "misfire": "missed",
    "max_retries": "retries",
    "retry": "retries",
    "time_limit": "timeout",
    "max_runtime": "timeout",
    "expiry": "expires",
}
#: A retry waits at most this long by default (``retry_backoff_max``).
RETRY_BACKOFF_MAX = timedelta(minutes=10)
#: The first retry waits this long by default (``retry_backoff``); each later one twice as long.
RETRY_BACKOFF = timedelta(seconds=1)


def unknown_option(key: str) -> str:
    """Return the sentence that names an unknown keyword of ``@scheduled`` and its fix."""
    meant = _ALIASES.get(key) or next(iter(difflib.get_close_matches(key, OPTIONS, n=1)), None)
    if meant is not None:
        return f"did you mean {meant}=?"
    return f"the options are {', '.join(name + '=' for name in OPTIONS)}"


def _definition(func: Any, given: Mapping[str, Any]) -> TaskDefinition:
    """Return the definition that ``@scheduled(**given)`` on *func* declares; a mistake in
    *given* makes a definition that carries its error, never an exception."""
    engine = engines.engine_of(func)
    unknown = [key for key in given if key not in OPTIONS]
    options = {**OPTIONS, **{key: value for key, value in given.items() if key in OPTIONS}}
    name = options.pop("name")
    if options["missed"] == MissedRuns.COALESCE:
        options["missed"] = None  # the default: tasks declared with and without it are alike
    args, kwargs, expires = options.pop("args"), options.pop("kwargs"), options.pop("expires")
    lock = options.pop("lock")
    recover = options.pop("recover")
    jitter = options.pop("jitter")
    most, least = options.pop("lock_at_most_for"), options.pop("lock_at_least_for")
    timeout, retries = options.pop("timeout"), options.pop("retries")
    backoff, backoff_max = options.pop("retry_backoff"), options.pop("retry_backoff_max")
    trigger_options = _shared({key: value for key, value in options.items() if value is not None})
    origin = _origin(func, engine)
    task_name = name if name is not None else origin
    if not isinstance(task_name, str) or not task_name.strip():
        # An error definition is still kept by name: one that is no name takes its origin.
        task_name, bad_name = origin, task_name
    else:
        bad_name = None
    calls: dict[str, Any] = {"engine": engine}
    try:
        if unknown:
            key = unknown[0]
            raise _Invalid(
                "option",
                f"@scheduled() got an unknown option {key}={given[key]!r}; {unknown_option(key)}",
            )
        if engine is None and not callable(func):
            raise _Invalid("function", f"{func!r} is not callable")
        if bad_name is not None:
            raise _Invalid("name", f"name={bad_name!r} must be a non-empty string; give name='...'")
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
        except (ValueError, TypeError) as exc:
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
        calls.update(_limits(engine, timeout, retries, backoff, backoff_max))
    except _Invalid as exc:
        return _defined(
            task_name,
            func,
            trigger_options,
            lock=lock if isinstance(lock, bool) else True,
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


def _limits(
    engine: str | None, timeout: Any, retries: Any, backoff: Any, backoff_max: Any
) -> dict[str, Any]:
    """Check ``timeout=`` and the retry options; return them as the definition's."""
    timeout_td = None
    if timeout is not None:
        try:
            timeout_td = parse_duration(timeout, name="timeout", allow_zero=False)
        except ValueError as exc:
            raise _Invalid("limits", str(exc)) from None
        if engine == engines.DJANGO_TASKS:
            raise _Invalid(
                "engine",
                f"timeout={timeout!r} cannot be passed to a django.tasks Task: the framework has "
                "no time limit; drop timeout= and bound the run in the task or the worker",
            )
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise _Invalid("limits", f"retries={retries!r} must be a whole number, 0 or more")
    if retries and engine is not None:
        raise _Invalid(
            "engine",
            f"retries={retries!r} on a task that is enqueued: its engine retries it, not the "
            "scheduler; drop retries= and use the engine's retries (Celery: autoretry_for= "
            "and max_retries= on the task)",
        )
    if not retries and (backoff is not None or backoff_max is not None):
        raise _Invalid(
            "limits", "retry_backoff= and retry_backoff_max= need retries=1 or more; drop them"
        )
    try:
        backoff_td = (
            RETRY_BACKOFF
            if backoff is None
            else parse_duration(backoff, name="retry_backoff", allow_zero=False)
        )
        backoff_max_td = (
            max(RETRY_BACKOFF_MAX, backoff_td)
            if backoff_max is None
            else parse_duration(backoff_max, name="retry_backoff_max", allow_zero=False)
        )
    except ValueError as exc:
        raise _Invalid("limits", str(exc)) from None
    if backoff_max_td < backoff_td:
        raise _Invalid(
            "limits",
            f"retry_backoff_max ({backoff_max!r}) is shorter than retry_backoff ({backoff!r}); "
            "raise retry_backoff_max",
        )
    if not retries:
        return {"timeout": timeout_td}
    return {
        "timeout": timeout_td,
        "retries": retries,
        "retry_backoff": backoff_td,
        "retry_backoff_max": backoff_max_td,
    }


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

    def add(self, func: Any, **options: Any) -> TaskDefinition:
        """Record *func* as a task declared with *options* (those of ``@scheduled``) and
        return its definition. Never raises: a mistake is kept in the definition's ``error``,
        for the system checks to report."""
        try:
            definition = _definition(func, options)
        except Exception as exc:  # a value that breaks a check itself: still a check error
            definition = _defined(
                _origin_or_repr(func),
                func,
                {},
                error=f"@scheduled() could not read its options: {type(exc).__name__}: {exc}",
                error_field="option",
            )
        return self._keep(definition)

    def _keep(self, definition: TaskDefinition) -> TaskDefinition:
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


@overload
def scheduled(func: F, /) -> F: ...  # a bare @scheduled: an error that manage.py check reports


@overload
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
    timeout: DurationLike | None = None,
    retries: int = 0,
    retry_backoff: DurationLike | None = None,
    retry_backoff_max: DurationLike | None = None,
) -> Callable[[F], F]: ...


def scheduled(*given: Any, **options: Any) -> Any:
    """Declare the decorated function a scheduled task and return it unchanged.

    Give exactly one trigger: ``cron=`` (with an optional ``zone=``), ``fixed_rate=``,
    ``fixed_delay=`` (both with an optional ``initial_delay=``) or ``at=`` (one shot).
    ``args=`` and ``kwargs=`` are the arguments of each call. On a django.tasks ``Task`` or a
    Celery task, each firing enqueues the task instead of calling it; ``expires=`` (Celery
    only) bounds how long its message may wait for a worker: by default until the task's next
    fire time, ``False`` for ever. Several ``@scheduled`` lines with distinct ``name=`` give
    one callable several schedules.

    A mistake (an unknown keyword, a value of the wrong type, a bare ``@scheduled`` without
    parentheses) never raises: the task is recorded with its error, which ``manage.py check``
    reports, and the function is returned unchanged all the same.
    """
    if given:
        if len(given) == 1 and not options and _decoratable(given[0]):
            # A bare @scheduled: the function came where the options should be.
            func = given[0]
            registry._keep(
                _defined(
                    _origin_or_repr(func),
                    func,
                    {},
                    error="@scheduled needs its options in parentheses: write "
                    "@scheduled(cron=...), @scheduled(fixed_rate=...) or "
                    "@scheduled(fixed_delay=...)",
                    error_field="option",
                )
            )
            return func
        positional = given[0]

        def refuse(func: F) -> F:
            hint = f"; did you mean cron={positional!r}?" if isinstance(positional, str) else ""
            registry._keep(
                _defined(
                    _origin_or_repr(func),
                    func,
                    {},
                    error=f"@scheduled() takes options by keyword only, got the positional "
                    f"argument {positional!r}{hint}",
                    error_field="option",
                )
            )
            return func

        return refuse

    def decorate(func: F) -> F:
        registry.add(func, **options)
        return func

    return decorate


def _decoratable(obj: object) -> bool:
    """Return whether *obj* is what ``@scheduled`` decorates: a function or a task object."""
    return engines.engine_of(obj) is not None or inspect.isroutine(obj) or inspect.isclass(obj)


def _origin_or_repr(func: Any) -> str:
    """Return the dotted path of *func*, or its repr when it has none."""
    try:
        return _origin(func, engines.engine_of(func))[:NAME_LENGTH]
    except Exception:
        return repr(func)[:NAME_LENGTH]


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
