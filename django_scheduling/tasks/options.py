"""The options of ``@scheduled``: one table of them, and the checks that turn a declaration
into a ``TaskDefinition``. A mistake never raises: the definition carries it, for the system
checks to report."""

from __future__ import annotations

import difflib
import inspect
import json
from collections.abc import Callable, Mapping
from datetime import timedelta
from types import FunctionType, MappingProxyType
from typing import Any

from ..conf import NAME_LENGTH
from ..schedules.durations import DurationLike, parse_duration
from ..schedules.triggers import MissedRuns, make_trigger, trigger_key
from . import engines
from .definition import TaskDefinition, TaskOptions, origin_of

__all__ = ["OPTIONS", "RETRY_BACKOFF", "RETRY_BACKOFF_MAX", "declared", "invalid", "unknown_option"]


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


def declared(
    func: Any, given: Mapping[str, Any], *, declared_in: str | None = None
) -> TaskDefinition:
    """Return the definition that ``@scheduled(**given)`` on *func* declares; a mistake in
    *given* makes a definition that carries its error, never an exception. *declared_in*
    names where the options were given when not by ``@scheduled`` on *func* (an entry of
    ``SCHEDULING["SCHEDULE"]``)."""
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
    origin = origin_of(func, engine)
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
                f"{'the entry has' if declared_in else '@scheduled() got'} an unknown option "
                f"{key}={given[key]!r}; {unknown_option(key)}",
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
            declared_in=declared_in,
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
        declared_in=declared_in,
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


def invalid(
    func: Any, name: str, error: str, *, field: str = "option", declared_in: str | None = None
) -> TaskDefinition:
    """Return the definition of a task whose declaration is wrong beyond its options (a bare
    ``@scheduled``, a positional argument, an entry of settings without a target): it carries
    *error*, for the checks to report."""
    return _defined(name, func, {}, error=error, error_field=field, declared_in=declared_in)


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
