"""Errors that are the user's to fix.

The CLI turns a :class:`UserError` into one line on stderr and exit status 2; anything else is a bug (exit 1).
Keeping the distinction in one exception type means library code never prints or exits by itself.
"""

from __future__ import annotations


class UserError(Exception):
    """Bad input: a missing file, a misspelt field, a layout that cannot exist.

    The message is a single line that names the field and what would be valid.
    """

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()) if "\n" in message else message)
