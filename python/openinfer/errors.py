"""The one exception type that openinfer raises for protocol-level failures."""

from __future__ import annotations


class InferenceServerError(Exception):
    """A request failed with an HTTP status and a message, as the V2 protocol reports it.

    One class rather than a hierarchy: callers branch on `.status` (404 unknown model, 400 bad
    request, 503 not ready, ...) exactly as they would on the wire.
    """

    def __init__(self, status: int, message: str) -> None:
        super().__init__(status, message)
        self.status = status
        self.message = message

    def __str__(self) -> str:
        return f"[{self.status}] {self.message}"
