"""Errors brrr raises for bad user input. The CLI prints them as one line, without a traceback."""


class BrrrError(Exception):
    """A problem with what the user asked for (a missing file, a wrong device, a bad FUNC)."""
