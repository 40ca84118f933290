"""`FileStepStore`: runs as directories of plain JSON files (see `docs/file-store.md`)."""

from step_persistence.stores.file._io import IoCounters
from step_persistence.stores.file.store import FileStepStore

__all__ = ['FileStepStore', 'IoCounters']
