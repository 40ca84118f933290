"""The MongoDB store: runs, events, snapshots and tool effects as documents, via pymongo or motor.

Its media store (`media_store.MongoMediaStore`, also exported by `step_persistence.media`) keeps
large message parts as chunked blobs in the same database.

Needs the `mongodb` extra (`pip install "step-persistence[mongodb]"`). See docs/mongo.md.
"""

try:
    import pymongo  # noqa: F401
except ImportError as error:
    raise ImportError('the MongoDB stores need the pymongo driver: pip install "step-persistence[mongodb]"') from error

from step_persistence.stores.mongo._client import MongoClientLike
from step_persistence.stores.mongo._indexes import IndexCreationError
from step_persistence.stores.mongo._limits import MAX_DOCUMENT_BYTES
from step_persistence.stores.mongo.store import MongoStepStore

__all__ = ['MAX_DOCUMENT_BYTES', 'IndexCreationError', 'MongoClientLike', 'MongoStepStore']
