"""One error type for everything a user can get wrong, and the lines every message uses: `field: what (got value) Fix: how`.

`TrainforgeError` carries where the problem is (`source`), one line per problem, and the exit code the CLI
leaves with; the CLI catches it in one place. `problems()` turns pydantic validation errors into those lines,
shared by the stack config, the job spec and the run config, so a reader sees one style everywhere.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:  # pydantic costs 70 ms to import: `trainforge --help` and the path checks do not need it
    from pydantic import ValidationError

# Exit codes of the CLI (README): 1 the job or an operation failed, 2 bad input, 3 not admitted.
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_NOT_ADMITTED = 3


class TrainforgeError(Exception):
    """A problem the user can fix. str() is the whole message: a headline, then one line per problem.

    Subclasses set `what` (the headline's noun) and `exit_code`; `source` names the file or object at fault.
    """

    what = "error in"
    exit_code = EXIT_BAD_INPUT

    def __init__(self, source: str, problems: list[str] | str, exit_code: int | None = None):
        self.source = source
        listed = [problems] if isinstance(problems, str) else list(problems)
        self.problems = [elide(p) for p in listed[:MAX_PROBLEMS]]
        if len(listed) > MAX_PROBLEMS:  # 20,000 unknown keys must not print megabytes: the first ones say what is wrong
            self.problems.append(f"... and {len(listed) - MAX_PROBLEMS} more problems of the same file (fix these first)")
        if exit_code is not None:
            self.exit_code = exit_code
        super().__init__(self._message())

    def _message(self) -> str:
        if len(self.problems) == 1 and not self.source:
            return self.problems[0]
        return f"{self.what} {self.source}:\n" + "\n".join(f"  - {p}" for p in self.problems)


MAX_PROBLEMS = 20  # listed per error; the rest counted
MAX_LINE = 600  # a problem line quoting a value pasted by mistake (a 1 MB string) must not flood the terminal


def elide(line: str) -> str:
    """The line's start (the field, the value's start) and its end (the fix), the middle left out past MAX_LINE."""
    if len(line) <= MAX_LINE:
        return line
    keep = MAX_LINE // 2
    return f"{line[:keep]} ...[{len(line) - 2 * keep} characters left out]... {line[-keep:]}"


# A validator that already names a sub-field ("instance_types: ...") gets it joined onto the location.
FIELD_PREFIX = re.compile(r"^[a-z_][\w.\[\]-]*: ")


def location(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif str(part).startswith("function-") or part in ("dict", "list"):
            continue  # pydantic's internal validator names carry no meaning for the reader
        else:
            out += f".{part}" if out else str(part)
    return out


# How to write the value, from what pydantic knows of the constraint; used when the caller has no better fix.
PATTERN_MEANING = {r"^[a-z]([a-z0-9-]*[a-z0-9])?$": "lowercase letters, digits and '-', starting with a letter, e.g. my-job"}
_BOUNDS = {"greater_than": ("gt", "greater than"), "greater_than_equal": ("ge", "at least"),
           "less_than": ("lt", "less than"), "less_than_equal": ("le", "at most")}
_KINDS = {"int_type": "a whole number", "int_parsing": "a whole number", "int_from_float": "a whole number",
          "float_type": "a number, e.g. 3e-4", "float_parsing": "a number, e.g. 3e-4", "finite_number": "a finite number",
          "string_type": "text (quote it if it looks like a number)", "dict_type": "a mapping of name: value",
          "list_type": "a list", "bool_type": "true or false", "bool_parsing": "true or false",
          "literal_error": "one of the values listed", "enum": "one of the values listed", "missing": "add it",
          "extra_forbidden": "remove it or correct the spelling", "model_type": "a mapping of its fields",
          "model_attributes_type": "a mapping of its fields"}


def generic_fix(error: Mapping[str, Any]) -> str:
    kind, ctx = error["type"], error.get("ctx") or {}
    if kind in _BOUNDS:
        key, words = _BOUNDS[kind]
        return f". Fix: a value {words} {ctx.get(key)}"
    if kind == "string_too_long":
        return f". Fix: at most {ctx.get('max_length')} characters"
    if kind == "string_too_short":
        return f". Fix: at least {ctx.get('min_length')} characters"
    if kind == "too_short":
        return f". Fix: at least {ctx.get('min_length')} entries"
    if kind == "string_pattern_mismatch":
        pattern = str(ctx.get("pattern", ""))
        return f". Fix: {PATTERN_MEANING.get(pattern, 'a value matching ' + pattern)}"
    return f". Fix: {_KINDS[kind]}" if kind in _KINDS else ""


def problems(exc: ValidationError, fixes: Mapping[str, str] | None = None) -> list[str]:
    """One line per problem. `fixes` maps a pydantic error type (missing, extra_forbidden...) to a fix hint."""
    fixes = fixes or {}
    out = []
    for error in exc.errors(include_url=False):
        where = location(error["loc"])
        message = str(error["msg"]).removeprefix("Value error, ")
        # Our own validators put the value in the message; pydantic's built-in ones need it shown.
        got = "" if error["type"] in ("missing", "value_error") else f" (got {error.get('input')!r})"
        fix = fixes.get(error["type"]) or generic_fix(error)
        for line in message.split("\n"):
            if not where:
                out.append(f"{line}{got}" if error["type"] != "value_error" else line)
            elif FIELD_PREFIX.match(line):
                out.append(f"{where}.{line}")
            else:
                out.append(f"{where}: {line}{got}{fix}")
    return out
