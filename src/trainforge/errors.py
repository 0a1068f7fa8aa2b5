"""Turn pydantic validation errors into the lines every trainforge message uses: `field: what (got value) Fix: how`.

Shared by the stack config, the job spec and the run config, so a reader sees one style everywhere.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from pydantic import ValidationError

# A validator that already names a sub-field ("instance_types: ...") gets it joined onto the location.
_FIELD_PREFIX = re.compile(r"^[a-z_][\w.\[\]-]*: ")


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


def problems(exc: ValidationError, fixes: Mapping[str, str] | None = None) -> list[str]:
    """One line per problem. `fixes` maps a pydantic error type (missing, extra_forbidden...) to a fix hint."""
    fixes = fixes or {}
    out = []
    for error in exc.errors(include_url=False):
        where = location(error["loc"])
        message = str(error["msg"]).removeprefix("Value error, ")
        # Our own validators put the value in the message; pydantic's built-in ones need it shown.
        got = "" if error["type"] in ("missing", "value_error") else f" (got {error.get('input')!r})"
        fix = fixes.get(error["type"], "")
        for line in message.split("\n"):
            if not where:
                out.append(f"{line}{got}" if error["type"] != "value_error" else line)
            elif _FIELD_PREFIX.match(line):
                out.append(f"{where}.{line}")
            else:
                out.append(f"{where}: {line}{got}{fix}")
    return out
