"""Receipt's exceptions and the spec's exact error strings, each written once.

Tests compare against the constants and format functions here, never a copy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# -- the spec's exact strings ---------------------------------------------------------
SINGLETON_CANCEL_REASON = "singleton cancel"
STALE_ACTIVE_LEASE_ERROR = "stale active Resonate job lost execution; retrying through Resonate driver"
ACTIVE_DELIVERY_REASON = "active_delivery"
MAX_DELIVERY_GENERATIONS = 32


def no_job_message(job_id: str) -> str:
    return f"Invariant: no job for {job_id}"


def no_handler_message(agent_id: str) -> str:
    return f"No handler for agent '{agent_id}'"


def wrong_agent_message(agent_id: str, kind: str) -> str:
    """A built-in agent's refusal of a kind declared for another agent (or not declared at all)."""
    return f"agent '{agent_id}' does not run kind '{kind}'"


def generations_exceeded_message(job_id: str) -> str:
    return f"resonate delivery recovery exceeded {MAX_DELIVERY_GENERATIONS} generations for {job_id}"


# -- exceptions -----------------------------------------------------------------------
class ReceiptError(Exception):
    """Base of every error Receipt raises on purpose."""


class InvariantError(ReceiptError):
    """A receipt cannot be folded: the reducer's documented invariant was broken."""


class ValidationError(ReceiptError):
    """Input was rejected before anything was written; names the field and what it allows."""

    def __init__(self, field: str, message: str, allowed: Sequence[Any] | None = None) -> None:
        self.field = field
        self.reason = message  # the message without the field name (for callers that re-prefix it)
        self.allowed = list(allowed) if allowed is not None else None
        text = f"{field}: {message}"
        if self.allowed is not None:
            text += " (allowed: " + ", ".join(str(a) for a in self.allowed) + ")"
        super().__init__(text)
        self.message = text

    def to_details(self) -> dict[str, Any]:
        details: dict[str, Any] = {"field": self.field}
        if self.allowed is not None:
            details["allowed"] = self.allowed
        return details


class AppendConflict(ReceiptError):
    """Another writer appended to the stream first; re-read and re-decide."""


class JobNotFound(ReceiptError):
    """No job with that id (or not one the caller may see)."""


class ConflictError(ReceiptError):
    """The job's state does not allow the operation (e.g. canceling a terminal job)."""


class TooManyCommands(ConflictError):
    """The job already holds ``RECEIPT_MAX_COMMANDS_PER_JOB`` queue commands."""


class DeliveryGenerationsExceeded(ReceiptError):
    """The driver starter ran out of delivery generations for one job."""


class TransientStorageError(ReceiptError):
    """A storage failure worth retrying (connection lost, serialization failure)."""


class JobArchived(ReceiptError):
    """The key names a stream the archiving pass moved to the archive: the id stays taken, and
    ``summary`` (its tombstone's) is what a re-post or a read answers with."""

    def __init__(self, key: str, summary: Mapping[str, Any]) -> None:
        super().__init__(f"{key} was archived")
        self.key = key
        self.summary = summary
