"""`TokenUsage` and `StepEvent.model_name` take only what every backend stores as it is."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic_ai.usage import RequestUsage

from step_persistence import StepEvent, TokenUsage
from step_persistence.records import TOKEN_COUNT_MAX

COUNTS = {'input_tokens': 1, 'output_tokens': 2, 'cache_read_tokens': 0, 'cache_write_tokens': 0}


@pytest.mark.parametrize('count', [True, 1.0, '1', -1, TOKEN_COUNT_MAX + 1, None, [1]], ids=repr)
@pytest.mark.parametrize('name', list(COUNTS))
def test_a_count_is_an_int_from_zero_to_the_largest_stored_number(name: str, count: Any) -> None:
    with pytest.raises(ValueError, match=name):
        TokenUsage.model_validate({**COUNTS, name: count})


def test_every_count_is_required_and_nothing_else_is_taken() -> None:
    assert TokenUsage.model_validate({**COUNTS, 'input_tokens': TOKEN_COUNT_MAX}).input_tokens == TOKEN_COUNT_MAX
    with pytest.raises(ValueError, match='cache_read_tokens'):
        TokenUsage.model_validate({'input_tokens': 1, 'output_tokens': 2, 'cache_write_tokens': 0})
    with pytest.raises(ValueError, match='cost'):
        TokenUsage.model_validate({**COUNTS, 'cost': 1})


@pytest.mark.parametrize('fields', [{'model_name': 5}, {'model_name': b'm'}, {'usage': RequestUsage(input_tokens=1)}])
def test_an_event_refuses_a_model_name_that_is_not_text_and_a_usage_that_is_not_token_usage(
    fields: dict[str, Any],
) -> None:
    with pytest.raises(ValueError, match=next(iter(fields))):
        StepEvent(run_id='r', kind='model_request_completed', step_index=1, **fields)
