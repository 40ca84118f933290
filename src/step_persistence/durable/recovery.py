"""`recover_abandoned`: resume the durable workflows whose run stopped holding its lease (a crashed process)."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic_ai.agent.abstract import AbstractAgent
from pydantic_ai.capabilities import AbstractCapability

from step_persistence.durable.engine import StepDurability
from step_persistence.durable.fingerprints import inputs_fingerprint
from step_persistence.durable.inputs import InputsUnavailable, read_inputs
from step_persistence.durable.journals import journal_for, journal_media
from step_persistence.durable.leases import RECOVERY_LEASE, Clock, Lease, new_owner
from step_persistence.durable.protocol import JournalStore
from step_persistence.durable.records import Fence, WorkflowRecord
from step_persistence.protocol import StepStore
from step_persistence.records import utc_now

__all__ = ['DepsFor', 'Recovery', 'RecoveryOutcome', 'recover_abandoned']

logger = logging.getLogger('step_persistence.durable')

RecoveryOutcome = Literal['resumed', 'failed', 'taken', 'skipped']
"""`resumed`: claimed and run to its end here; `failed`: claimed, and its run raised; `taken`: another process
claimed it first (or it ended meanwhile); `skipped`: not claimed, since it cannot be resumed here (`detail`)."""


@dataclass(frozen=True)
class Recovery:
    """What `recover_abandoned` did with one abandoned workflow."""

    workflow_id: str
    agent_name: str | None
    outcome: RecoveryOutcome
    detail: str | None = None
    """Why it was skipped, or the error its run raised."""
    output: Any = None
    """The resumed run's output."""


DepsFor = Callable[[WorkflowRecord], Any]
"""The `deps` a recovered workflow's run is given, made from its record (an awaitable's result is awaited)."""

_Agents = dict[str, tuple[AbstractAgent[Any, Any], StepDurability[Any]]]
"""The agents given, by name, with their `StepDurability`."""


def _durability(agent: AbstractAgent[Any, Any]) -> StepDurability[Any] | None:
    found: list[StepDurability[Any]] = []

    def collect(capability: AbstractCapability[Any]) -> None:
        if isinstance(capability, StepDurability):
            found.append(capability)

    root: AbstractCapability[Any] | None = getattr(agent, 'root_capability', None)
    if root is not None:
        root.apply(collect)
    return found[0] if found else None


def _agents_by_name(agents: Iterable[AbstractAgent[Any, Any]]) -> _Agents:
    by_name: _Agents = {}
    for agent in agents:
        if not isinstance(agent, AbstractAgent):
            raise TypeError(f'agents must be pydantic-ai agents, not {type(agent).__name__}')
        durability = _durability(agent)
        if durability is None or agent.name is None:
            raise ValueError(f'agent {agent.name!r} has no StepDurability (or no name): it runs no durable workflow')
        if agent.name in by_name:
            raise ValueError(f'two agents are named {agent.name!r}: a workflow is matched to its agent by name')
        by_name[agent.name] = (agent, durability)
    return by_name


async def recover_abandoned(
    store: StepStore,
    *,
    agents: Iterable[AbstractAgent[Any, Any]],
    deps: DepsFor | None = None,
    clock: Clock = utc_now,
) -> list[Recovery]:
    """Claim each `running` workflow of `store` whose lease expired, and resume it; what became of each.

    A workflow is resumed by the agent named as the one that ran it (its `StepDurability` must journal
    in `store`'s storage, else `ValueError` before any claim; one of another `code_version` that does
    not allow the change skips it), with its recorded prompt, initial message history and deferred tool
    results, and `deps(workflow)` as its `deps` (none without `deps`), under its workflow id: its
    completed units replay and the rest run, its in-flight unit decided by its policy. The claim is
    atomic (compare-and-set on the lease), so of several processes recovering at once exactly one
    resumes a workflow; the others report it `taken`. Workflows are recovered one after another,
    oldest first; one whose run raises is reported `failed` (its workflow is then `failed`, no longer
    abandoned) and the next is recovered.
    """
    by_name = _agents_by_name(agents)
    journal = journal_for(store)
    abandoned = await journal.list_abandoned(now=clock())
    await _check_storage(store, abandoned, by_name)
    recoveries: list[Recovery] = []
    for record in abandoned:
        recoveries.append(await _recover(store, journal, record, by_name, deps, clock))
    return recoveries


async def _check_storage(store: StepStore, abandoned: Iterable[WorkflowRecord], by_name: _Agents) -> None:
    """`ValueError`, before any claim, if an agent that would resume one of `abandoned` journals elsewhere.

    Its run would journal in its own store: a claim in `store` it cannot hold, and a workflow of the same id
    started there. An agent whose `StepDurability` has another store object on the same storage (the same
    database or directory) passes: its journal holds the very workflow (the same id and first start).
    """
    checked: set[str] = set()
    for record in abandoned:
        name = record.agent_name
        found = None if name is None or name in checked else by_name.get(name)
        if name is None or found is None or record.inputs.get('parent') is not None:
            continue
        durability = found[1]
        if durability.store is not store:
            theirs = await journal_for(durability.store).get_workflow(workflow_id=record.workflow_id)
            if theirs is None or theirs.created_at != record.created_at:
                raise ValueError(
                    f"agent {name!r}'s StepDurability journals in another store than the one "
                    f'recovered, which does not hold its workflow {record.workflow_id!r}: give agents whose '
                    'StepDurability is built on that store'
                )
        checked.add(name)


async def _recover(
    store: StepStore,
    journal: JournalStore,
    record: WorkflowRecord,
    by_name: _Agents,
    deps_for: DepsFor | None,
    clock: Clock,
) -> Recovery:
    """Claim `record`'s workflow (if it can be resumed here) and run it to its end holding that lease."""
    workflow_id, agent_name = record.workflow_id, record.agent_name

    def outcome(kind: RecoveryOutcome, detail: str | None = None, output: Any = None) -> Recovery:
        return Recovery(workflow_id=workflow_id, agent_name=agent_name, outcome=kind, detail=detail, output=output)

    if record.inputs.get('parent') is not None:
        return outcome('skipped', "a delegate's workflow: its parent's run resumes it")
    found = by_name.get(agent_name) if agent_name is not None else None
    if found is None:
        return outcome('skipped', f'no agent named {agent_name!r} was given')
    if record.code_version != found[1].code_version and not found[1].allow_code_version_change:
        # Its run would be refused (`CodeVersionMismatchError`): left for a process running its code version.
        return outcome(
            'skipped', f'it was started by code version {record.code_version!r}, and this is {found[1].code_version!r}'
        )
    try:
        inputs = await read_inputs(store, journal, journal_media(store), record)
    except InputsUnavailable as error:
        return outcome('skipped', str(error))
    if inputs_fingerprint(inputs.prompt, inputs.history or []) != record.inputs.get('fingerprint'):
        # Recorded before prompts that are not text and histories were: its inputs are not known.
        return outcome('skipped', 'its run was started with inputs that were not recorded')
    deps: Any = None
    if deps_for is not None:
        try:
            deps = deps_for(record)
            if inspect.isawaitable(deps):
                deps = await deps
        except Exception as error:
            logger.warning('durable workflow %r: its deps could not be made', workflow_id, exc_info=True)
            return outcome('skipped', f'its deps could not be made: {type(error).__name__}: {error}')
    agent, durability = found
    owner, now = new_owner(), clock()
    expires_at = now + durability.lease_duration
    claimed = await journal.claim_workflow(
        workflow_id=workflow_id, owner=owner, lease_expires_at=expires_at, now=now, running_only=True
    )
    if claimed is None or claimed.owner != owner:
        return outcome('taken')
    lease = Lease(
        journal,
        workflow_id,
        Fence(owner=owner, epoch=claimed.fencing_epoch),
        duration=durability.lease_duration,
        expires_at=expires_at,
        clock=clock,
    )
    token = RECOVERY_LEASE.set(lease)
    try:
        result = await agent.run(
            inputs.prompt,
            message_history=inputs.history,
            deferred_tool_results=inputs.deferred_tool_results,
            deps=deps,
            run_id=workflow_id,
        )
    except Exception as error:
        logger.warning('durable workflow %r: its recovered run failed', workflow_id, exc_info=True)
        return outcome('failed', f'{type(error).__name__}: {error}')
    finally:
        RECOVERY_LEASE.reset(token)
    logger.info('durable workflow %r: recovered (fencing epoch %d)', workflow_id, claimed.fencing_epoch)
    return outcome('resumed', output=result.output)
