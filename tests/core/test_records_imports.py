"""The records name pydantic-ai's message types without importing pydantic-ai (issue 18, item 5).

Each check runs in a new interpreter, where nothing has imported pydantic-ai yet: the records
other than snapshots never import it, and `ContinuableSnapshot` and `StepWrites` validate,
serialize and nest in other models exactly as if the message types had been imported eagerly,
whichever of them is used first.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from pydantic import ValidationError
from pydantic_ai.messages import ModelMessage, ModelRequest, UserPromptPart

from step_persistence import ContinuableSnapshot
from step_persistence.records import StepWrites


def run_fresh(code: str) -> str:
    """Run `code` in a new interpreter; return what it printed (it must succeed)."""
    completed = subprocess.run(
        [sys.executable, '-c', textwrap.dedent(code)], capture_output=True, text=True, timeout=120, check=False
    )
    assert completed.returncode == 0, completed.stderr
    return completed.stdout.strip()


def test_the_other_records_never_import_pydantic_ai() -> None:
    printed = run_fresh(
        """
        import sys
        from step_persistence.records import RunRecord, StepEvent, ToolEffectRecord, ContinuableSnapshot, StepWrites
        record = RunRecord(run_id='r', agent_name='a')
        event = StepEvent.model_validate_json(StepEvent(run_id='r', kind='run_started', step_index=0).model_dump_json())
        effect = ToolEffectRecord(run_id='r', tool_call_id='c', tool_name='t', status='started').model_copy()
        header = ContinuableSnapshot.model_construct(run_id='r', step_index=0, messages=[])
        print('pydantic_ai' in sys.modules)
        """
    )
    assert printed == 'False'


FROM_RECORDS = 'from step_persistence.records import ContinuableSnapshot, StepWrites'
FROM_THE_PACKAGE = 'from step_persistence import ContinuableSnapshot'


@pytest.mark.parametrize(
    ('imported', 'first_use'),
    [
        (FROM_RECORDS, "ContinuableSnapshot(run_id='r', step_index=0, messages=messages)"),
        (FROM_RECORDS, "ContinuableSnapshot.model_validate({'run_id': 'r', 'step_index': 0, 'messages': messages})"),
        (FROM_RECORDS, "StepWrites(snapshots=[{'run_id': 'r', 'step_index': 0, 'messages': messages}]).snapshots[0]"),
        (
            FROM_THE_PACKAGE,
            "TypeAdapter(ContinuableSnapshot).validate_python({'run_id': 'r', 'step_index': 0, 'messages': messages})",
        ),
    ],
    ids=['construct', 'model_validate', 'nested in StepWrites', 'TypeAdapter after the package import'],
)
def test_a_snapshot_works_whatever_its_first_use(imported: str, first_use: str) -> None:
    printed = run_fresh(
        f"""
        import sys
        from pydantic import TypeAdapter
        {imported}
        from pydantic_ai.messages import ModelRequest, UserPromptPart
        messages = [ModelRequest(parts=[UserPromptPart('question')])]
        snapshot = {first_use}
        assert isinstance(snapshot.messages[0], ModelRequest), snapshot
        print(snapshot.model_dump_json(include={{'messages'}}))
        """
    )
    assert '"content":"question"' in printed


def test_a_snapshot_nests_in_another_model_once_imported_from_the_package() -> None:
    printed = run_fresh(
        """
        from pydantic import BaseModel
        from step_persistence import ContinuableSnapshot

        class Response(BaseModel):
            snapshot: ContinuableSnapshot

        response = Response.model_validate({'snapshot': {'run_id': 'r', 'step_index': 0, 'messages': []}})
        print(response.snapshot.run_id, sorted(Response.model_json_schema()['$defs']))
        """
    )
    assert printed.startswith('r [')
    assert "'ModelRequest'" in printed and "'ContinuableSnapshot'" in printed


def test_a_malformed_message_is_refused_where_it_is() -> None:
    with pytest.raises(ValidationError) as refused:
        ContinuableSnapshot.model_validate({'run_id': 'r', 'step_index': 0, 'messages': [{'kind': 'letter'}]})
    assert [error['loc'][:2] for error in refused.value.errors()] == [('messages', 0)]


def test_the_snapshot_models_are_those_of_the_message_types() -> None:
    messages: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart('question')])]
    writes = StepWrites(snapshots=[ContinuableSnapshot(run_id='r', step_index=0, messages=messages)])
    assert ContinuableSnapshot.model_fields['messages'].annotation == list[ModelMessage]
    assert writes.snapshots[0].messages == messages
