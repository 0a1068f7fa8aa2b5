"""Reading a YAML file a person wrote (job spec, sweep spec, stack file) without letting it cost more than it says.

Two ways a small-looking file can stall every command: its size (PyYAML's pure-Python parser reads about 1 MB/s, so a
50 MB file takes a minute before any field is checked) and aliases (`&a [...]`, `*a` nine times, nested: a
"billion laughs" document of 1 KB that expands to 10^9 values when the spec is validated or dumped). Our files are
kilobytes and never need anchors, so both are refused with the fix, before anything is built from them.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import yaml

MAX_BYTES = 1 << 20  # 1 MiB: the largest shipped stack file is about 10 KB


class Refused(yaml.YAMLError):
    """A file refused for its size or its aliases (the message says which and the fix)."""


def _refuse_alias(event: yaml.AliasEvent) -> Refused:
    return Refused(f"an alias (*{event.anchor}) at line {event.start_mark.line + 1}: anchors and aliases are not "
                   "accepted here. Fix: write the value out where it is used")


class _UniqueKeys:
    """A mapping that names a key twice is refused: YAML takes the last silently, so a setting written twice (a merge
    gone wrong, `gpus: 8` left below `gpus: 1`) would be half-ignored."""

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)  # type: ignore[attr-defined]  # the constructor's
            try:
                first = seen.setdefault(key, key_node.start_mark.line + 1)
            except TypeError:
                continue  # an unhashable key: the constructor refuses it with its own message
            if first != key_node.start_mark.line + 1:
                raise Refused(f"the key {key!r} is given twice (lines {first} and {key_node.start_mark.line + 1}): YAML would "
                              "keep the second silently. Fix: keep one")
        return super().construct_mapping(node, deep=deep)  # type: ignore[misc]  # the constructor's


class _NoAliasLoader(_UniqueKeys, yaml.SafeLoader):
    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            raise _refuse_alias(self.peek_event())
        return super().compose_node(parent, index)


# libyaml's parser, where PyYAML was built with it: about 5x the pure-Python one on prod's stack file (events scanned, then
# loaded). Every team stack reads every stack file of its platform to check the cohort: at 200 team stacks the pure-Python
# reads were about 40% of a team stack's evaluation. Its composer is compiled (no compose_node to hook), so aliases are
# looked for in its event stream first.
_FAST_LOADER: type | None = (type("_FastUniqueLoader", (_UniqueKeys, yaml.CSafeLoader), {})  # type: ignore[attr-defined]
                             if yaml.__with_libyaml__ else None)


def read(path: Path) -> Any:
    """The document in `path`. Raises FileNotFoundError, OSError, UnicodeDecodeError or yaml.YAMLError (message says why).

    Only a regular file is read, and at most MAX_BYTES of it: a path to /dev/zero or a FIFO (through a symlink too)
    would otherwise never finish reading or never open, and a file growing while it is read cannot outrun the limit."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO opens at once instead of waiting for a writer
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else \
                "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode) else "not a regular file"
            if stat.S_ISDIR(mode):
                raise IsADirectoryError(21, "Is a directory", str(path))
            raise Refused(f"{path} is {kind}, not a regular file. Fix: give the YAML file itself")
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(MAX_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_BYTES:
        raise Refused(f"the file is over {MAX_BYTES >> 20} MiB. Fix: this file holds settings only: keep data and code in "
                      "files it points to")
    return loads(data.decode("utf-8"))


def loads(text: str) -> Any:
    if _FAST_LOADER is None:
        return yaml.load(text, Loader=_NoAliasLoader)  # noqa: S506 - a SafeLoader that also refuses aliases
    for event in yaml.parse(text, Loader=_FAST_LOADER):
        if isinstance(event, yaml.AliasEvent):
            raise _refuse_alias(event)
    return yaml.load(text, Loader=_FAST_LOADER)  # noqa: S506 - libyaml's SafeLoader, the document holding no alias


def describe(exc: Exception) -> str:
    """Why a file could not be read, where, and the fix: one line for a problem list."""
    if isinstance(exc, Refused):
        return str(exc)
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        return (f"not valid YAML at line {mark.line + 1}, column {mark.column + 1}: {exc.problem}. Fix: check the indentation "
                "there (spaces, never tabs), quotes and brackets")
    if isinstance(exc, yaml.YAMLError):
        return f"not valid YAML: {str(exc).splitlines()[0]}"
    if isinstance(exc, UnicodeDecodeError):
        return f"not a text file ({exc.reason} at byte {exc.start}). Fix: give the YAML file, saved as UTF-8"
    if isinstance(exc, IsADirectoryError):
        return "a directory, not a file. Fix: give the YAML file inside it"
    if isinstance(exc, OSError):
        return f"cannot read it: {exc.strerror}. Fix: check the path and its permissions"
    return f"cannot read it: {exc}"

