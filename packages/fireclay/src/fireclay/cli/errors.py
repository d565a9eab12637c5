"""The command's errors, in a module of their own so that the subcommands can raise them without
importing the command's entry point (which imports them)."""

from __future__ import annotations


class CLIError(Exception):
    """A problem the user can fix; printed as one line, exit status 2."""


class InputSpecError(ValueError):
    """A malformed ``--inputs`` item; the message says what is expected."""


__all__ = ["CLIError", "InputSpecError"]
