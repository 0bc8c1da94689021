"""Management commands as tasks: ``ManagementCommand`` calls one with ``call_command()`` and
keeps the end of its output; ``argument_error()`` tells, without running it, whether a command
exists and takes the arguments a schedule gives it."""

from __future__ import annotations

import difflib
import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["OUTPUT_LIMIT", "CommandFailed", "CommandOutput", "ManagementCommand", "argument_error"]

#: The output kept of a command's run: its last 10 KB (of UTF-8).
OUTPUT_LIMIT = 10 * 1024
_CUT = "[earlier output cut]\n"
#: What ``call_command()`` would take from a schedule, but the scheduler sets itself.
_RESERVED = ("stdout", "stderr")


class CommandOutput(str):
    """What a command wrote to its ``self.stdout`` and ``self.stderr``, in order: the last
    ``OUTPUT_LIMIT`` bytes. The run's history keeps it."""


class CommandFailed(Exception):
    """A scheduled management command raised; *output* is what it wrote before, and the
    exception it raised is the ``__cause__``."""

    def __init__(self, command: str, error: BaseException, output: CommandOutput) -> None:
        kind, text = type(error).__name__, str(error)
        # Some errors name their kind themselves (SystemCheckError: "SystemCheckError: ...").
        said = text if text.startswith(f"{kind}:") else f"{kind}: {text}"
        super().__init__(f"manage.py {command} failed: {said}")
        self.command, self.output = command, output


@dataclass(frozen=True, slots=True)
class ManagementCommand:
    """A management command, called as a task: ``ManagementCommand("clearsessions")(*args,
    **options)`` runs ``call_command("clearsessions", *args, **options)`` and returns its
    output, or raises ``CommandFailed`` with it."""

    name: str

    def __call__(self, *args: Any, **options: Any) -> CommandOutput:
        from django.core.management import call_command

        tail = _Tail()
        try:
            call_command(self.name, *args, stdout=tail, stderr=tail, **options)
        except (Exception, SystemExit) as exc:  # CommandError, or sys.exit() in the command
            raise CommandFailed(self.name, exc, tail.text()) from exc
        return tail.text()


class _Tail(io.TextIOBase):
    """A text stream that keeps the last ``OUTPUT_LIMIT`` bytes written to it."""

    def __init__(self) -> None:
        super().__init__()
        self._parts: list[str] = []
        self._size = 0
        self._cut = False

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self._parts.append(text)
        self._size += len(text)
        if self._size > 2 * OUTPUT_LIMIT:  # a character is one to four bytes
            kept = "".join(self._parts)[-OUTPUT_LIMIT:]
            self._parts, self._size, self._cut = [kept], len(kept), True
        return len(text)

    def text(self) -> CommandOutput:
        whole = "".join(self._parts)
        encoded = whole.encode()
        if len(encoded) <= OUTPUT_LIMIT and not self._cut:
            return CommandOutput(whole)
        room = OUTPUT_LIMIT - len(_CUT)
        # Cut on a character's boundary: the bytes of a cut character are dropped.
        return CommandOutput(_CUT + encoded[-room:].decode("utf-8", "ignore"))


def argument_error(command: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str | None:
    """Return why ``call_command(command, *args, **kwargs)`` would refuse to run: no such
    command, or arguments it does not take; None when it would run. Reads the command's
    parser, as ``call_command()`` does, without running it."""
    from django.core.management import BaseCommand, CommandError, get_commands, load_command_class

    commands = get_commands()
    if command not in commands:
        close = difflib.get_close_matches(command, commands, n=1)
        hint = f"did you mean {close[0]!r}?" if close else "manage.py help lists the commands"
        return f"there is no management command {command!r}; {hint}"
    app = commands[command]
    try:
        handler = app if isinstance(app, BaseCommand) else load_command_class(app, command)
        parser = handler.create_parser("manage.py", command)
    except Exception as exc:
        return f"manage.py {command} could not be loaded: {type(exc).__name__}: {exc}"
    reserved = sorted(set(kwargs) & set(_RESERVED))
    if reserved:
        return (
            f"kwargs may not set {', '.join(reserved)}: the scheduler keeps the command's "
            "output with its run"
        )
    # Options by their flag ("--dry-run" as dry_run) or by their dest, as call_command() takes.
    by_flag = {
        min(action.option_strings).lstrip("-").replace("-", "_"): action
        for action in parser._actions
        if action.option_strings
    }
    known = {action.dest for action in parser._actions} | set(by_flag)
    known |= set(handler.base_stealth_options) | set(handler.stealth_options)
    unknown = sorted(set(kwargs) - known)
    if unknown:
        options = sorted(name for name in by_flag if name not in ("help", "version"))
        return (
            f"manage.py {command} has no option {', '.join(unknown)}; its options are "
            f"{', '.join(options)}"
        )
    # The positional arguments, and the required options (call_command() passes those to
    # the parser too), parsed as the command would parse them.
    given = [str(arg) for arg in args]
    for key, value in kwargs.items():
        action = by_flag.get(key)
        if action is not None and action.required:
            given += [min(action.option_strings), str(value)]
    try:
        parser.parse_args(given)
    except (CommandError, SystemExit) as exc:
        return f"args={tuple(args)!r} do not fit manage.py {command}: {exc}"
    return None
