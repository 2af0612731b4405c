"""Errors a user can act on. The CLI prints them as one line and exits non-zero, never a traceback."""

from __future__ import annotations


class UserError(Exception):
    """Bad input: a file, document or field the user must fix. Exit code 2 unless `exit_code` says else."""

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def where(file: str, document: int | None = None, field: str | None = None) -> str:
    """`FILE`, `FILE: document N`, `FILE: document N: field a.b.c` - the prefix of every input error."""
    text = file
    if document is not None:
        text += f": document {document}"
    if field:
        text += f": field {field}"
    return text
