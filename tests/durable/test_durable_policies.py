"""A tool's durable configuration (`{'step_persistence': {...}}` in its metadata) and the in-flight policy it means."""

from __future__ import annotations

from typing import Any

import pytest

from step_persistence.durable.policies import InFlightPolicy, UnitPolicy, tool_policy


@pytest.mark.parametrize(
    ('config', 'default', 'expected'),
    [
        (None, 'fail', UnitPolicy('fail', explicit=False)),
        ({}, 'ask', UnitPolicy('ask', explicit=False)),
        ({'idempotent': True}, 'fail', UnitPolicy('rerun')),
        ({'idempotent': False}, 'rerun', UnitPolicy('fail')),
        ({'idempotent': False}, 'ask', UnitPolicy('ask')),
        ({'idempotent': False}, 'fail', UnitPolicy('fail')),
        ({'in_flight': 'ask'}, 'rerun', UnitPolicy('ask')),
        ({'in_flight': 'rerun', 'idempotent': True}, 'fail', UnitPolicy('rerun')),
        ({'in_flight': 'ask', 'idempotent': False}, 'rerun', UnitPolicy('ask')),
    ],
)
def test_a_tools_configuration_gives_its_policy(
    config: dict[str, Any] | None, default: InFlightPolicy, expected: UnitPolicy
) -> None:
    metadata = None if config is None else {'step_persistence': config}
    assert tool_policy(metadata, tool_name='charge', default=default) == expected


@pytest.mark.parametrize(
    ('config', 'message'),
    [
        ({'idempotent': 'yes'}, r"'idempotent'\] must be True or False, not 'yes'"),
        ({'idempotent': 1}, r"'idempotent'\] must be True or False, not 1"),
        ({'in_flight': 'rerun', 'idempotent': False}, "idempotent=False and in_flight='rerun', which contradict"),
        ({'in_flight': 'fail', 'idempotent': True}, "idempotent=True and in_flight='fail', which contradict"),
        ({'in_flight': 'sometimes'}, "the in-flight policy must be one of .* not 'sometimes'"),
        ({'retries': 3}, r"unknown keys in metadata\['step_persistence'\]: \['retries'\]"),
        ('rerun', r"metadata\['step_persistence'\] must be a dict, not 'rerun'"),
    ],
)
def test_a_configuration_a_tool_cannot_mean_is_refused_naming_it(config: object, message: str) -> None:
    with pytest.raises(ValueError, match=f"^tool 'charge': .*{message}"):
        tool_policy({'step_persistence': config}, tool_name='charge', default='fail')
