"""What a replay does with a unit that was in flight when its run stopped (journaled `started`, never ended)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, get_args

__all__ = ['IN_FLIGHT_POLICIES', 'METADATA_KEY', 'RERUN', 'InFlightPolicy', 'UnitPolicy', 'check_policy', 'tool_policy']

InFlightPolicy = Literal['rerun', 'fail', 'ask']
"""`rerun`: run the unit again (at least once); `fail`: the run fails naming the call; `ask`: the run ends with
`DeferredToolRequests` for that call, so an orchestrator or a human approves running it again."""

IN_FLIGHT_POLICIES: frozenset[str] = frozenset(get_args(InFlightPolicy))

METADATA_KEY = 'step_persistence'
"""The tool metadata key of a tool's durable configuration: `{'in_flight': ...}` or `{'idempotent': True}`
(`False`: a tool that must not run again, whatever `in_flight_tools` says)."""


@dataclass(frozen=True)
class UnitPolicy:
    """The durable configuration of one unit (pydantic-ai resolves it per tool from the tool's metadata)."""

    in_flight: InFlightPolicy
    explicit: bool = True
    """Set for the tool itself (its metadata), not taken from `in_flight_tools`: a tool that delegated to a
    child workflow reruns unless its own policy says otherwise (docs/durable.md, "Delegates")."""


RERUN = UnitPolicy(in_flight='rerun')


def check_policy(value: object, where: str) -> InFlightPolicy:
    """`value` as an in-flight policy; `ValueError` naming `where` if it is none."""
    if value not in IN_FLIGHT_POLICIES:
        raise ValueError(f'{where}: the in-flight policy must be one of {sorted(IN_FLIGHT_POLICIES)}, not {value!r}')
    policy: InFlightPolicy = value  # type: ignore[assignment]
    return policy


def tool_policy(metadata: dict[str, Any] | None, *, tool_name: str, default: InFlightPolicy) -> UnitPolicy:
    """The policy of a tool: its metadata's `in_flight`, else `idempotent` (`True`: `rerun`; `False`: `default`, or
    `fail` when that is `rerun`), else `default`. `ValueError` naming the tool for a configuration it cannot mean."""
    config = (metadata or {}).get(METADATA_KEY)
    if config is None:
        return UnitPolicy(in_flight=default, explicit=False)
    where = f'tool {tool_name!r}'
    if not isinstance(config, dict):
        raise ValueError(f'{where}: metadata[{METADATA_KEY!r}] must be a dict, not {config!r}')
    unknown = set(config) - {'in_flight', 'idempotent'}
    if unknown:
        raise ValueError(f'{where}: unknown keys in metadata[{METADATA_KEY!r}]: {sorted(unknown)}')
    idempotent = config.get('idempotent')
    if idempotent is not None and not isinstance(idempotent, bool):
        raise ValueError(f"{where}: metadata[{METADATA_KEY!r}]['idempotent'] must be True or False, not {idempotent!r}")
    if 'in_flight' in config:
        policy = check_policy(config['in_flight'], where)
        if idempotent is not None and idempotent != (policy == 'rerun'):
            raise ValueError(
                f'{where}: metadata[{METADATA_KEY!r}] says idempotent={idempotent} and in_flight={policy!r}, which '
                'contradict each other (a tool is run again after a crash only if it is idempotent): give one of them'
            )
        return UnitPolicy(in_flight=policy)
    if idempotent is None:
        return UnitPolicy(in_flight=default, explicit=False)
    if idempotent:
        return RERUN
    # Not idempotent: never run again, whatever the default (and a delegating tool does not rerun either).
    return UnitPolicy(in_flight='fail' if default == 'rerun' else default)
