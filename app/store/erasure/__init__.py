"""Erasure of one user of a namespace, with proof, and the user's data package.

The saga of seed 000 ("Erasure") and seed 002 ("Retention and erasure"), run in the
background by the job dispatcher (``services.jobs``, which also finds and deletes the
queued jobs naming the user), lives in ``saga``; each concept has its module:

``receipt``       the kinds counted, the steps, the census's shape and the receipt.
``run``           one attempt (whom, which lock) and the progress hook.
``saga``          ``ErasureStore``: start, the background run, resume, the steps, the end.
``leftovers``     the searches the sweep and the census share.
``census``        the final check that fails the erasure closed.
``worker_state``  the user in what the workers keep between passes.
``aof``           the append-only file rewrite after an erasure.
``scanning``      SCAN over every primary (one server, or each primary of a cluster).
``export``        ``SubjectExportStore``: the data package.
"""

from app.store.erasure.export import EXPORT_FORMAT, SubjectExportStore
from app.store.erasure.receipt import KINDS, STEPS, Census, receipt_of
from app.store.erasure.run import PROGRESS, ErasureRun, Progress
from app.store.erasure.saga import LOCK_TTL_MS, MAX_HANDLES, ErasureStore, erasure_id
from app.store.erasure.worker_state import scrub_user

__all__ = [
    "EXPORT_FORMAT", "KINDS", "LOCK_TTL_MS", "MAX_HANDLES", "PROGRESS", "STEPS",
    "Census", "ErasureRun", "ErasureStore", "Progress", "SubjectExportStore", "erasure_id",
    "receipt_of", "scrub_user",
]
