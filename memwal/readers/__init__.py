"""memwal's LSM read API: fresh point lookups, scans and searches over a memwal table.

>>> from memwal import readers
>>> r = readers.open("/data/users")            # eventual consistency, refreshed every second
>>> r.get(42)                                   # -> {"id": 42, ...} or None
>>> r.scan(columns=["id", "score"], where="score > 3", limit=10)
"""

from memwal.readers.config import ReadConfig
from memwal.readers.reader import Consistency, Reader, ReadPlan, open

__all__ = ["Consistency", "ReadConfig", "ReadPlan", "Reader", "open"]
