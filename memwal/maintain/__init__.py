"""The maintenance side: what keeps a table in shape while it is written.

The service (``maintenance``: flushes of stranded MemTables, compaction, index catch-up,
GC, view refreshes, each on its schedule), the pieces it runs (``compactor``, ``gc``,
``basefiles``, ``bounds``), and what an operator runs or reads: ``status``, ``check``,
``repair``, ``health``, ``upgrade`` and schema changes (``evolve``)."""
