"""Values for the statements the scheduler writes out itself, without Django's field machinery,
whose per-value checks cost more than the statement for a batch of a thousand rows.

The app requires ``USE_TZ`` (E006), and a database that holds UTC: on MySQL and SQLite, no
``TIME_ZONE`` option of its own (E016). Its values are converted here directly; Django's own
conversions serve a database with that option (read by the admin or a command, never by a
started scheduler).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db.models.functions import Now
from django.utils import timezone

__all__ = [
    "DatabaseUtcNow",
    "any_of",
    "array_literal",
    "arrays",
    "rows_of",
    "update_from",
    "duration_between",
    "timestamp_cast",
    "column",
    "datetime_adapter",
    "datetime_as_text",
    "datetime_reader",
    "duration_adapter",
]


def _holds_utc(conn: Any) -> bool:
    return conn.settings_dict.get("TIME_ZONE") in (None, "UTC")


def datetime_adapter(conn: Any) -> Callable[[datetime | None], Any]:
    """Return a function that turns an aware datetime into what *conn*'s driver stores for a
    ``DateTimeField``, as Django writes it."""
    if conn.vendor == "postgresql":
        return lambda value: value
    if not _holds_utc(conn):
        return conn.ops.adapt_datetimefield_value
    if conn.vendor == "sqlite":
        # str(), as Django's SQLite backend: the column is compared as text.
        return lambda value: None if value is None else str(_naive(value))
    # MySQL: as text too, which its driver escapes several times faster than it formats a
    # datetime; and the values of a batch mostly repeat, so each is formatted once.
    texts: dict[datetime, str] = {}

    def adapt(value: datetime | None) -> str | None:
        if value is None:
            return None
        try:
            return texts[value]
        except KeyError:
            if len(texts) > 1000:
                texts.clear()
            text = texts[value] = str(_naive(value))
            return text

    return adapt


def _naive(value: datetime) -> datetime:
    if value.tzinfo is UTC:  # the scheduler's own times: no conversion needed
        return value.replace(tzinfo=None)
    return value.astimezone(UTC).replace(tzinfo=None)


def datetime_as_text(conn: Any, expression: str) -> str:
    """Return the SQL of the datetime *expression* selected as text, for ``datetime_reader``.

    For the rows of a burst, whose times mostly repeat: the driver hands text over as it is,
    and the reader's caller converts each distinct value once. As datetimes, every value of
    every row is converted by the driver, on PostgreSQL through Django's timezone loader, in
    Python (in a profile of 10,000 tasks due every second on 3 instances, 6 % of an
    instance's time).
    """
    if conn.vendor == "mysql":
        return f"CAST({expression} AS CHAR)"
    if conn.vendor == "postgresql":
        # As a UTC timestamp without zone: the text is then the same whatever the session's
        # time zone. (psycopg reads datetimes only with the ISO DateStyle, so Django runs with
        # it, and the text is ISO 8601.)
        return f"CAST(({expression}) AT TIME ZONE 'UTC' AS text)"
    return expression  # SQLite stores text


def datetime_reader(conn: Any) -> Callable[[Any], datetime | None]:
    """Return a function that turns a datetime column's value, as *conn*'s driver returns it
    without Django's converters (or as ``datetime_as_text`` selects it), into an aware
    datetime.

    It converts each distinct value once and hands out that one object after: the rows of a
    batch mostly share their times. Make one per statement's rows, so that what it keeps goes
    with them."""
    zone = UTC if conn.vendor == "postgresql" or _holds_utc(conn) else conn.timezone
    converted: dict[Any, datetime | None] = {None: None}

    def convert(value: Any) -> datetime:
        if isinstance(value, str):  # SQLite, or datetime_as_text
            value = datetime.fromisoformat(value)
        if value.tzinfo is None:
            return value.replace(tzinfo=zone) if zone is UTC else timezone.make_aware(value, zone)
        return value

    def read(value: Any) -> datetime | None:
        try:
            return converted[value]
        except KeyError:
            result = converted[value] = convert(value)
            return result

    return read


def duration_adapter(conn: Any) -> Callable[[timedelta], Any]:
    """Return a function that turns a timedelta into what *conn* stores for a
    ``DurationField``: an interval on PostgreSQL, microseconds elsewhere."""
    if conn.vendor == "postgresql":
        return lambda value: value
    return lambda value: value // timedelta(microseconds=1)


def any_of(conn: Any, expression: str, values: list[Any]) -> tuple[str, list[Any]]:
    """Return the SQL and parameters of "*expression* is one of *values*" (names, not empty).

    On PostgreSQL one array parameter, ``= ANY(%s::text[])``: the statement's text is the same
    whatever the batch's size, so psycopg converts it once and caches it, where a placeholder
    per value made it parse a new text for each batch (in a profile of 10,000 firings a
    second, the largest cost of the scheduler's own processes). The array is passed as the
    text of an array literal (see ``array_literal``).

    On SQLite one JSON array, read by ``json_each``, for the same reason: its driver keeps the
    last 128 statements of each connection prepared, each as large as its parameters. With a
    text per batch size, the writer's connection kept about 80 of them (140,000 parameters),
    and a scheduler's memory grew by about 0.6 MB a second at 1,000 tasks due every second.
    Elsewhere (and on an SQLite built without JSON), ``IN (%s, ...)``.
    """
    if conn.vendor == "postgresql":
        return f"{expression} = ANY(%s::text[])", [array_literal("text", values)]
    if conn.vendor == "sqlite" and conn.features.supports_json_field:
        return f"{expression} IN (SELECT value FROM json_each(%s))", [json.dumps(list(values))]
    return f"{expression} IN ({', '.join(['%s'] * len(values))})", list(values)


def arrays(types: list[str], names: list[str], columns: list[list[Any]]) -> tuple[str, list[str]]:
    """Return PostgreSQL's ``unnest(%s::type[], ...) AS v(name, ...)`` and its parameters: the
    rows of a batch as one array per column (see ``any_of``), each column's values in
    *columns*."""
    sql = ", ".join(f"%s::{kind}[]" for kind in types)
    params = [array_literal(kind, values) for kind, values in zip(types, columns, strict=True)]
    return f"unnest({sql}) AS v({', '.join(names)})", params


def timestamp_cast(conn: Any) -> str:
    """Return the cast that types a datetime parameter in a ``SELECT`` list: PostgreSQL
    cannot infer it there; elsewhere the parameter is the column's text."""
    return "::timestamptz" if conn.vendor == "postgresql" else ""


#: The column types of MariaDB's ``JSON_TABLE`` for the types ``arrays`` takes.
_JSON_TABLE_TYPES = {
    "text": "VARCHAR(255)",  # the longest text sent: lock names, triggers, result ids
    "bigint": "BIGINT",
    "integer": "INT",
    "timestamptz": "DATETIME(6)",
}


def rows_of(
    conn: Any,
    types: list[str],
    names: list[str],
    columns: list[list[Any]],
    *,
    compares_text: bool = False,
) -> tuple[str, list[Any]] | None:
    """Return the rows of a batch as a table ``v(name, ...)`` to select from, and its
    parameters, whose text and number are the same whatever the batch's size (see
    ``any_of``); each column's values in *columns*, of the *types* ``arrays`` takes.

    On PostgreSQL one array per column (``arrays``). On SQLite one JSON array of the rows, read
    by ``json_each``: a text per batch size kept as many large prepared statements in each
    connection (at 10,000 tasks due every second, about 6 MB of SQLite's memory in the
    scheduler's process, against 1.5-4.7 MB with its statement cache cut to 16). On MariaDB
    (10.6 or later) the same JSON array, read by ``JSON_TABLE``: MySQLdb escapes each
    parameter in Python, and a placeholder per value made that about a tenth of a scheduler's
    time at 10,000 tasks due every second (100 runs' starts: 0.72 ms of the client's CPU with
    a placeholder per value, 0.44 ms with one JSON text; their ends: 0.71 and 0.40 ms).

    ``None`` where there is no such form: SQLite before 3.35 (whose ``UPDATE ... FROM`` and
    ``RETURNING`` the callers need) or without JSON; MySQL, and MariaDB before 10.6. Also
    ``None`` on MariaDB when the caller *compares_text* of the rows with a table's column:
    ``JSON_TABLE``'s texts have the connection's collation, which may not be the table's,
    and MariaDB refuses to compare two collations. Then a placeholder per value.
    """
    if conn.vendor == "postgresql":
        return arrays(types, names, columns)
    features = conn.features
    if conn.vendor == "sqlite":
        if not (features.supports_json_field and features.can_return_rows_from_bulk_insert):
            return None
        fields = ", ".join(
            f"json_extract(value, '$[{i}]') AS {name}" for i, name in enumerate(names)
        )
        table = f"(SELECT {fields} FROM json_each(%s)) AS v"
    elif _has_json_table(conn) and not compares_text:
        fields = ", ".join(
            f"{name} {_JSON_TABLE_TYPES[kind]} PATH '$[{i}]'"
            for i, (kind, name) in enumerate(zip(types, names, strict=True))
        )
        table = f"JSON_TABLE(%s, '$[*]' COLUMNS ({fields})) AS v"
    else:
        return None
    adapt = datetime_adapter(conn)
    values = [
        [adapt(value) for value in column] if kind == "timestamptz" else column
        for kind, column in zip(types, columns, strict=True)
    ]
    return table, [json.dumps(list(zip(*values, strict=True)))]


def _has_json_table(conn: Any) -> bool:
    return (
        conn.vendor == "mysql"
        and conn.mysql_is_mariadb
        and conn.mysql_version >= (10, 6)
        and conn.features.supports_json_field
    )


def update_from(
    conn: Any,
    table: str,
    rows: tuple[str, list[Any]],
    assignments: list[tuple[str, str]],
    params: list[Any],
    on: tuple[str, list[Any]],
) -> tuple[str, list[Any]]:
    """Return an ``UPDATE`` of *table* (as ``t``) from *rows* (what ``rows_of`` returns: the
    table ``v`` and its parameters), setting each (column, expression) of *assignments*,
    whose parameters are *params*, in the rows that the condition *on* (SQL and parameters)
    matches; and the statement's parameters. MySQL joins the rows; PostgreSQL and SQLite
    read them ``FROM``."""
    (rows_sql, rows_params), (condition, on_params) = rows, on
    if conn.vendor == "mysql":
        sets = ", ".join(f"t.{name} = {value}" for name, value in assignments)
        statement = f"UPDATE {table} t JOIN {rows_sql} ON {condition} SET {sets}"
        return statement, [*rows_params, *on_params, *params]
    sets = ", ".join(f"{name} = {value}" for name, value in assignments)
    statement = f"UPDATE {table} AS t SET {sets} FROM {rows_sql} WHERE {condition}"
    return statement, [*params, *rows_params, *on_params]


def duration_between(conn: Any, start: str, end: str) -> str:
    """Return the SQL of the ``DurationField`` value from *start* to *end* (two datetime
    expressions): an interval on PostgreSQL, microseconds on MySQL. SQLite has no exact
    form (its date functions count days in floating point): its callers compute the value."""
    if conn.vendor == "postgresql":
        return f"{end} - {start}"
    if conn.vendor == "mysql":
        return f"TIMESTAMPDIFF(MICROSECOND, {start}, {end})"
    raise ValueError(f"no exact duration expression on {conn.vendor}")


def array_literal(kind: str, values: list[Any]) -> str:
    """Return the text of PostgreSQL's array literal of *values* (``{"a","b",NULL}``), for a
    ``%s::kind[]`` parameter; *kind* is ``text``, ``bigint``, ``integer`` or ``timestamptz``
    (of aware datetimes).

    psycopg formats a list parameter element by element in Python, which made the arrays of
    the claims and of the writer the largest cost of a scheduler at 10,000 firings a second
    (a fifth of its CPU); a text is one value for it. Measured with psycopg's ``mogrify``, 100
    rows: the runs' starts (six columns) 495 µs as lists, 48 µs as literals; their ends (four
    columns, every time distinct) 452 µs and 206 µs. The times of a batch mostly repeat, so
    each is formatted once.
    """
    items: list[str] = []
    append = items.append
    if kind == "text":
        for value in values:
            if value is None:
                append("NULL")
                continue
            if '"' in value or "\\" in value:  # rare: a test per value costs less than a replace
                value = value.replace("\\", "\\\\").replace('"', '\\"')
            append('"' + value + '"')
    elif kind == "timestamptz":
        # By fold too: the two times of an hour repeated when the clocks go back are equal.
        texts: dict[tuple[datetime, int], str] = {}
        for value in values:
            if value is None:
                append("NULL")
                continue
            text = texts.get((value, value.fold))
            if text is None:
                if value.tzinfo is None:
                    raise ValueError(f"a naive datetime for a timestamptz array: {value!r}")
                text = texts[(value, value.fold)] = '"' + value.isoformat() + '"'
            append(text)
    elif kind in ("bigint", "integer"):
        for value in values:
            append("NULL" if value is None else str(int(value)))
    else:
        raise ValueError(f"no array literal for {kind!r}: text, timestamptz, bigint or integer")
    return "{" + ",".join(items) + "}"


def column(model: Any, field: str) -> str:
    """Return the column name of *model*'s field *field*."""
    found = model._meta.get_field(field)
    return str(found.column)


class DatabaseUtcNow(Now):
    """The database's clock in UTC, as the lock statements read it, for comparisons with the
    lock table's UTC times: ``UTC_TIMESTAMP(6)`` on MySQL; elsewhere Django's ``Now()``
    (``STATEMENT_TIMESTAMP()`` on PostgreSQL, UTC text on SQLite).

    Django's ``Now()`` is ``CURRENT_TIMESTAMP(6)`` on MySQL: the session's time zone, which
    Django leaves as the server's, so on a server in local time every lock looked expired (or
    held) hours off."""

    def as_mysql(self, compiler: Any, connection: Any, **extra_context: Any) -> Any:
        return self.as_sql(compiler, connection, template="UTC_TIMESTAMP(6)", **extra_context)
