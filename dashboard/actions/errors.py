"""What an action raises for input it refuses."""
from __future__ import annotations


class ActionError(Exception):
    """Bad input to an operator action: ``message`` is for the user (a page shows it, the API
    answers ``{"error": message}``), ``status`` the HTTP status (400 bad input, 404 nothing
    matches, 409 wrong state, 503 a service is down).  Nothing was changed."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.status = status

    def __str__(self) -> str:
        return self.message
