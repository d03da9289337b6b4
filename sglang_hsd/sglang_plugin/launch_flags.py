"""Command lines of ``python -m sglang.launch_server`` as lists of flags, so that flags filled in
by a launcher (``sglang-hsd serve``) and flags a user passes through can be merged without
duplicates: a user flag replaces the filled-in flag of the same name.

A flag is a word starting with ``--``; the words after it up to the next flag are its values
(``--sleep-on-idle`` has none, ``--port 30000`` one). ``--name=value`` is read as ``--name value``.
Single-dash words (``-1``) are values, so negative numbers pass through.
"""

from __future__ import annotations

from dataclasses import dataclass


class LaunchFlagError(ValueError):
    """A command line that cannot be read as flags; the message names the word."""


@dataclass(frozen=True)
class Flag:
    """One flag of a command line.

    Fields:
        name: the flag with its dashes, e.g. ``"--port"``.
        values: the words that follow it, e.g. ``("30000",)``; empty for a switch.
    """

    name: str
    values: tuple[str, ...] = ()

    @property
    def value(self) -> str | None:
        """The single value (None for a switch; the first of several)."""
        return self.values[0] if self.values else None

    def words(self) -> list[str]:
        return [self.name, *self.values]


def parse_flags(words: list[str], source: str) -> list[Flag]:
    """``["--port", "1", "--sleep-on-idle"]`` -> ``[Flag("--port", ("1",)), Flag("--sleep-on-idle")]``.

    ``source`` names where the words came from in errors. Raises ``LaunchFlagError`` for a value
    before any flag.
    """
    flags: list[Flag] = []
    for word in words:
        if word.startswith("--") and len(word) > 2:
            name, sep, value = word.partition("=")
            flags.append(Flag(name, (value,) if sep else ()))
        elif not flags:
            raise LaunchFlagError(f"{source}: {word!r} is not a flag (SGLang's flags start with --)")
        else:
            flags[-1] = Flag(flags[-1].name, (*flags[-1].values, word))
    return flags


def duplicated(flags: list[Flag]) -> list[str]:
    """Names given more than once, in order of their second appearance."""
    seen: set[str] = set()
    repeated = []
    for flag in flags:
        if flag.name in seen and flag.name not in repeated:
            repeated.append(flag.name)
        seen.add(flag.name)
    return repeated


def merge_flags(filled: list[Flag], user: list[Flag]) -> list[Flag]:
    """``filled`` with each flag ``user`` also names replaced in place by the user's, then the
    user's other flags: one flag per name."""
    given = {flag.name: flag for flag in user}
    names = {flag.name for flag in filled}
    return [given.get(flag.name, flag) for flag in filled] + [f for f in user if f.name not in names]


def flag_words(flags: list[Flag]) -> list[str]:
    """The command-line words of ``flags``, in order."""
    return [word for flag in flags for word in flag.words()]


def flag_values(flags: list[Flag]) -> dict[str, tuple[str, ...]]:
    """Name -> values (the last occurrence wins, as in argparse)."""
    return {flag.name: flag.values for flag in flags}
