"""The errors a durable run raises when its journal and the run it replays disagree."""

from __future__ import annotations

from collections.abc import Sequence

from step_persistence._replay import InFlightRefusal

__all__ = [
    'AskWithoutDeferredOutputError',
    'CodeVersionMismatchError',
    'DurableReplayError',
    'InFlightUnitError',
    'LeaseLostError',
    'ReplayDivergedError',
    'WorkflowHeldError',
]


def _fallback(workflow_id: str) -> str:
    """Where to go on from: `StepPersistence` records a durable run under its workflow id."""
    return (
        'to go on from what the run stored, start a new run from its latest snapshot instead: '
        f'step_persistence.continue_run(store, run_id={workflow_id!r}) (docs/recovery.md)'
    )


class DurableReplayError(RuntimeError):
    """A durable workflow cannot be replayed as it is journaled."""

    def __init__(self, message: str, *, workflow_id: str, unit_key: str | None = None) -> None:
        super().__init__(message)
        self.workflow_id = workflow_id
        self.unit_key = unit_key


class ReplayDivergedError(DurableReplayError):
    """A replayed unit's inputs (messages, tool arguments) differ from those it was journaled with."""

    def __init__(self, *, workflow_id: str, unit_key: str, what: str) -> None:
        super().__init__(
            f'durable workflow {workflow_id!r} diverged from its journal at unit {unit_key!r}: {what}; '
            f'a replay must run the same agent with the same inputs. {_fallback(workflow_id)}',
            workflow_id=workflow_id,
            unit_key=unit_key,
        )


class InFlightUnitError(DurableReplayError, InFlightRefusal):
    """A unit was in flight when its run stopped, and its policy (`fail`) forbids running it again.

    A tool call's ledger record stays `started`, with the interrupted run's idempotency key and effect summary.
    """

    def __init__(self, *, workflow_id: str, unit_key: str, call: str) -> None:
        super().__init__(
            f'durable workflow {workflow_id!r}: {call} was in flight when the run stopped (unit {unit_key!r}), '
            'so its side effect may or may not have happened, and its in-flight policy is "fail". Check the '
            "effect, then mark the tool idempotent (metadata {'step_persistence': {'in_flight': 'rerun'}}), use "
            f'"ask", or: {_fallback(workflow_id)}',
            workflow_id=workflow_id,
            unit_key=unit_key,
        )


class AskWithoutDeferredOutputError(DurableReplayError):
    """The `ask` policy handed in-flight calls back, and the run's output type cannot end with `DeferredToolRequests`.

    Raised from pydantic-ai's own `UserError` (its `__cause__`). Nothing was run: the calls' units stay in flight
    and their ledger records `started`, so a run of the workflow whose output type includes
    `DeferredToolRequests` (or with another policy for the tools) resumes it.
    """

    def __init__(self, *, workflow_id: str, calls: Sequence[str]) -> None:
        super().__init__(
            f'durable workflow {workflow_id!r}: {", ".join(calls)} was in flight when the run stopped and its '
            'in-flight policy is "ask", which ends the run with DeferredToolRequests for it, but the output type of '
            'this run does not include DeferredToolRequests. Nothing was run: run the workflow again with '
            'output_type=[..., DeferredToolRequests] (on the agent, or the run), or give the tool another policy '
            f"(metadata {{'step_persistence': {{'in_flight': ...}}}}), or: {_fallback(workflow_id)}",
            workflow_id=workflow_id,
        )
        self.calls = tuple(calls)


class CodeVersionMismatchError(DurableReplayError):
    """The workflow was started by another version of the code, and the caller did not allow it."""

    def __init__(self, *, workflow_id: str, recorded: str | None, running: str | None) -> None:
        super().__init__(
            f'durable workflow {workflow_id!r} was started by code version {recorded!r}, and this is '
            f'{running!r}: its journal may not match what this code does. Pass '
            f'StepDurability(..., allow_code_version_change=True) to replay it anyway, or: {_fallback(workflow_id)}',
            workflow_id=workflow_id,
        )


class LeaseLostError(DurableReplayError):
    """A write of a run that no longer holds its workflow's lease (another process claimed it) was refused."""

    def __init__(self, *, workflow_id: str, owner: str, epoch: int) -> None:
        super().__init__(
            f'durable workflow {workflow_id!r}: this run (owner {owner!r}, fencing epoch {epoch}) no longer holds '
            'its lease, which another process claimed after it expired; this run stops here and writes nothing '
            'more to the journal (the other process resumes the workflow)',
            workflow_id=workflow_id,
        )
        self.owner = owner
        self.epoch = epoch


class WorkflowHeldError(DurableReplayError):
    """The workflow is being run by another process, whose lease has not expired."""

    def __init__(self, *, workflow_id: str, owner: str | None, lease_expires_at: object) -> None:
        super().__init__(
            f'durable workflow {workflow_id!r} is being run by {owner!r}, whose lease expires at '
            f'{lease_expires_at}; a run of it starts only once that lease is released or expired '
            '(step_persistence.durable.recover_abandoned resumes it then)',
            workflow_id=workflow_id,
        )
        self.owner = owner
