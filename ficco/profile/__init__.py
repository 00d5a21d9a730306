"""Profile records: the append-only store with resume (a directory, or a database URL through
:func:`open_store`), and the records as a DataFrame.

Pure Python at import (pandas only inside :func:`load_frame`); never imports torch.
"""

from ficco.profile.frame import (
    COLUMNS,
    SIGNATURE_COLUMNS,
    MixedFingerprints,
    fingerprint_counts,
    frame_from_records,
    load_frame,
    model_of,
    pick_fingerprint,
)
from ficco.profile.header import (
    HEADER_FILE,
    RECORDS_FILE,
    SCHEMA_VERSION,
    SEALED_RECORDS_FILE,
    header_differences,
    read_header,
)
from ficco.profile.selection import (
    SHIPPED_GPU_STORE,
    CpuTimings,
    CpuTimingsWarning,
    selection_frame,
)
from ficco.profile.store import (
    MemoryStore,
    ProfileStore,
    Store,
    StoreWarning,
    measurement_of,
)
from ficco.profile.stores import is_store_url, open_store

__all__ = [
    "COLUMNS",
    "HEADER_FILE",
    "RECORDS_FILE",
    "SCHEMA_VERSION",
    "SEALED_RECORDS_FILE",
    "SHIPPED_GPU_STORE",
    "SIGNATURE_COLUMNS",
    "CpuTimings",
    "CpuTimingsWarning",
    "MixedFingerprints",
    "MemoryStore",
    "ProfileStore",
    "Store",
    "StoreWarning",
    "fingerprint_counts",
    "frame_from_records",
    "header_differences",
    "is_store_url",
    "load_frame",
    "measurement_of",
    "model_of",
    "open_store",
    "pick_fingerprint",
    "read_header",
    "selection_frame",
]
