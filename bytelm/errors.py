"""Exceptions for bad user input.

A :class:`UserError` carries a message that names the offending input and how to fix it. The CLI
prints it on one line and exits with status 2, without a traceback. It subclasses ``ValueError``
so library callers can catch it the usual way.
"""


class UserError(ValueError):
    """Bad input from a user (a path, a spec, a config value): the message says how to fix it."""
