"""User errors: bad input that the CLI reports as one line and exit code 2."""

from __future__ import annotations


class UserError(Exception):
    """Bad input from the user. ``str()`` is the whole message, one line, naming what and where."""


class ConfigError(UserError):
    """A sweep or stage config value is wrong: names the file, the field path and the value."""

    def __init__(self, source: str, path: str, problem: str, value: object = ..., ) -> None:
        self.source, self.path, self.problem, self.value = source, path, problem, value
        where = ": ".join(p for p in (source, path) if p)
        got = "" if value is ... else f", got {value!r}"
        super().__init__(f"{where}: {problem}{got}" if where else f"{problem}{got}")
