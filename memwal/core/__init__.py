"""The kernel: what a table is on disk and in memory, with no reader, writer, service or engine.

On-disk paths (``paths``), storage (``io``, ``storage``), Lance's errors classified
(``lance_errors``), sharding and routing (``transforms``, ``sharding``, ``routing``), the
schema and metadata, shard manifests and the MemWAL index (``manifest``), the WAL
(``wal``), snapshots (``snapshot``), index catch-up (``indexes``) and
:class:`~memwal.core.state.TableState`, the handle every layer above works from. Nothing
here imports a module outside this folder but ``memwal.proto`` (the import contract in
``pyproject.toml`` says so)."""
