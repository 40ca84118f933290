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
"""The tool metadata key of a tool's durable configuration: `{'in_flight': ...}` or `{'idempotent': True}`."""


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
    """The policy of a tool: its metadata's `in_flight` (or `idempotent: True`, meaning `rerun`), else `default`."""
    config = (metadata or {}).get(METADATA_KEY)
    if config is None:
        return UnitPolicy(in_flight=default, explicit=False)
    if not isinstance(config, dict):
        raise ValueError(f'tool {tool_name!r}: metadata[{METADATA_KEY!r}] must be a dict, not {config!r}')
    unknown = set(config) - {'in_flight', 'idempotent'}
    if unknown:
        raise ValueError(f'tool {tool_name!r}: unknown keys in metadata[{METADATA_KEY!r}]: {sorted(unknown)}')
    if 'in_flight' in config:
        return UnitPolicy(in_flight=check_policy(config['in_flight'], f'tool {tool_name!r}'))
    if config.get('idempotent') is True:
        return RERUN
    return UnitPolicy(in_flight=default, explicit=False)
