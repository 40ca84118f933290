"""Read-only stores over what pydantic-ai-harness wrote: its file store, SQLite, PostgreSQL and MongoDB.

`harness+file://`, `harness+sqlite://`, `harness+postgresql://` and `harness+mongodb://` URLs open
them through `from_spec` (so `step-persistence copy harness+sqlite:///old.db sqlite:///runs.db`
works); `step_persistence.adoption` converts a harness SQL database in place. See docs/migrating.md.
"""

from step_persistence.stores.harness._base import HarnessStore, ReadOnlyStoreError
from step_persistence.stores.harness.files import HarnessFileStore

__all__ = ['HarnessFileStore', 'HarnessStore', 'ReadOnlyStoreError']
