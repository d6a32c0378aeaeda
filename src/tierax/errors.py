"""Errors a user can fix.  The CLI maps them to exit code 2."""


class TieraxError(ValueError):
    """Bad input: the message names the problem and the fix."""
