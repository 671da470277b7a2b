"""Every on-disk path memwal reads or writes, and the bit-reversed file names.

Lance's MemWAL layout under a table root (pylance 14.0.2)::

    {table}/_versions/{u64::MAX - version}.manifest     base table manifests (V2 naming)
    {table}/_mem_wal/{shard-uuid}/
        manifest/{bitrev64(version)}.binpb            ShardManifest protobuf, versions from 1
        manifest/version_hint.json                    {"version": N}, best effort
        wal/{bitrev64(position)}.arrow                Arrow IPC stream, positions from 1
        {8hex}_gen_{g}/                               SSTable: a one-fragment Lance dataset

memwal's own files live next to Lance's, never inside Lance's directories::

    {table}/_memwal/maintenance.json                  the maintenance service's last metrics
    {table}/_memwal/base-paused.json                  a widening in progress: no base commit but its own
    {table}/_memwal/source.json                       the topic a whole-database ingest fills the table from
    {table}/_memwal/views/{name}/                     materialized view metadata
    {table}/_memwal/views/{name}/_memwal_hold.json    generations the view still has to read (GC keeps them)
    {table}/_memwal/feeds/{name}.json                 a change-feed consumer's position and hold
    {table}/_memwal/quarantine/{stamp}/...            files ``memwal repair`` moved aside
    {table}/_memwal/upgrade/{stamp}/                  ``memwal upgrade``: its marker, the new base
                                                      while built, the old base after (until purged)
    {table}_dead_letters/                             dead-letter Lance table (sibling)
    {table}_deleted_sequences/                        sequences of deleted keys, for --drop-stale (sibling)

Keeping all of this in one module means a layout change touches one file.
"""

from __future__ import annotations

import functools
import os
import re
from typing import Final

MEM_WAL_DIR: Final = "_mem_wal"
MEMWAL_META_DIR: Final = "_memwal"
MANIFEST_DIR: Final = "manifest"
WAL_DIR: Final = "wal"
VERSION_HINT: Final = "version_hint.json"
MANIFEST_SUFFIX: Final = ".binpb"
WAL_SUFFIX: Final = ".arrow"
BASE_VERSIONS_DIR: Final = "_versions"
U64_MAX: Final = (1 << 64) - 1

SSTABLE_DIR_RE: Final = re.compile(r"^(?P<prefix>[0-9a-f]{8})_gen_(?P<generation>[0-9]+)$")
_BITREV_RE: Final = re.compile(r"^[01]{64}$")


def bitrev64(n: int) -> str:
    """The 64-character bit-reversed binary name Lance uses for WAL positions and versions.

    Reversing the bits spreads sequential numbers across an object store's key space.
    """
    if not 0 <= n <= U64_MAX:
        raise ValueError(f"bitrev64 takes an unsigned 64-bit integer, got {n}")
    return format(n, "064b")[::-1]


@functools.lru_cache(maxsize=1 << 16)
def parse_bitrev64(name: str) -> int:
    """Inverse of :func:`bitrev64`; accepts the bare name or one with a file suffix.

    Cached: GC and readers parse the same listings of WAL entries and manifest versions
    every cycle."""
    stem = name.split(".", 1)[0]
    if not _BITREV_RE.match(stem):
        raise ValueError(f"not a bit-reversed 64-bit name: {name!r}")
    return int(stem[::-1], 2)


def join(*parts: str) -> str:
    """Join path parts with '/', the separator of both local paths and object-store keys."""
    head, *rest = parts
    out = head.rstrip("/")
    for part in rest:
        out = f"{out}/{part.strip('/')}"
    return out


def basename(uri: str) -> str:
    """The last part of a URI or path: a table's name under the root that holds it."""
    return uri.rstrip("/").rpartition("/")[2]


def normalize_uri(uri: str) -> str:
    """A table URI without a trailing slash; local paths (and ``file://`` URIs) become absolute
    paths, so every process names a table's files the same way."""
    if uri.startswith("file://"):
        uri = uri[len("file://") :]
    if "://" not in uri:
        uri = os.path.abspath(os.path.expanduser(uri))
    return uri.rstrip("/") or "/"


def mem_wal_root(table: str) -> str:
    return join(table, MEM_WAL_DIR)


def shard_dir(table: str, shard_id: str) -> str:
    return join(table, MEM_WAL_DIR, shard_id)


def shard_manifest_dir(table: str, shard_id: str) -> str:
    return join(shard_dir(table, shard_id), MANIFEST_DIR)


def shard_manifest_path(table: str, shard_id: str, version: int) -> str:
    return join(shard_manifest_dir(table, shard_id), bitrev64(version) + MANIFEST_SUFFIX)


def shard_version_hint_path(table: str, shard_id: str) -> str:
    return join(shard_manifest_dir(table, shard_id), VERSION_HINT)


def wal_dir(table: str, shard_id: str) -> str:
    return join(shard_dir(table, shard_id), WAL_DIR)


def wal_entry_path(table: str, shard_id: str, position: int) -> str:
    return join(wal_dir(table, shard_id), bitrev64(position) + WAL_SUFFIX)


def sstable_path(table: str, shard_id: str, dirname: str) -> str:
    return join(shard_dir(table, shard_id), dirname)


def sstable_generation(dirname: str) -> int | None:
    """The generation encoded in an SSTable directory name, or None if it is not one."""
    m = SSTABLE_DIR_RE.match(dirname)
    return int(m.group("generation")) if m else None


def base_manifest_path(table: str, version: int) -> str:
    """Path of a base table manifest under Lance's V2 naming (``u64::MAX - version``)."""
    return join(table, BASE_VERSIONS_DIR, f"{U64_MAX - version}.manifest")


def base_manifest_path_v1(table: str, version: int) -> str:
    """Path of a base table manifest under Lance's older naming (``{version}.manifest``)."""
    return join(table, BASE_VERSIONS_DIR, f"{version}.manifest")


def writer_lease(table: str, shard_id: str) -> str:
    """The lease a live writer of a shard renews (memwal's own directory, beside Lance's)."""
    return join(table, MEMWAL_META_DIR, "writers", f"{shard_id}.json")


def base_pause(table: str) -> str:
    """While a column is widened (:mod:`memwal.maintain.evolve`): maintenance commits nothing to the base
    until this marker is gone or expired (JSON: until when, and why)."""
    return join(table, MEMWAL_META_DIR, "base-paused.json")


def source_topic(table: str) -> str:
    """The Kafka topic a whole-database ingest fills the table from (JSON), claimed once."""
    return join(table, MEMWAL_META_DIR, "source.json")


def maintenance_metrics(table: str) -> str:
    """The maintenance service's last published metrics (JSON)."""
    return join(table, MEMWAL_META_DIR, "maintenance.json")


def quarantine_dir(table: str, stamp: str) -> str:
    """Where one ``memwal repair`` run moves the files it cannot read (``stamp``: when it ran).

    Inside memwal's own directory, never under ``_mem_wal/``: nothing that lists shards,
    WAL entries or SSTables ever sees a quarantined file.
    """
    return join(table, MEMWAL_META_DIR, "quarantine", stamp)


def quarantined(table: str, stamp: str, path: str) -> str:
    """The quarantine path of ``path`` (a file or directory of the table): its path relative
    to the table root, kept, so a person can move it back."""
    root = table.rstrip("/") + "/"
    if not path.startswith(root):
        raise ValueError(f"{path} is not inside table {table}")
    return join(quarantine_dir(table, stamp), path[len(root):])


def views_dir(table: str) -> str:
    return join(table, MEMWAL_META_DIR, "views")


def view_meta_dir(table: str, name: str) -> str:
    return join(views_dir(table), name)


def view_hold(table: str, name: str) -> str:
    """A view's change-log hold (see :mod:`memwal.core.holds`); inside the view's directory, so
    dropping the view releases it."""
    return join(view_meta_dir(table, name), "_memwal_hold.json")


def feeds_dir(table: str) -> str:
    return join(table, MEMWAL_META_DIR, "feeds")


def feed_hold(table: str, name: str) -> str:
    """A registered change-feed consumer's position and hold (see :mod:`memwal.core.holds`)."""
    return join(feeds_dir(table), f"{name}.json")


def deleted_sequences_table(table: str) -> str:
    """Beside its table like the dead letters (memwal.write.deleted)."""
    return table.rstrip("/") + "_deleted_sequences"


def dead_letter_table(table: str) -> str:
    """The dead-letter table sits beside its target table, never inside it."""
    return table.rstrip("/") + "_dead_letters"
