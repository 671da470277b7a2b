"""The manifest store: shard manifests and the MemWAL index, as Lance wrote them.

Lance 14.0.2 has no Python API to list shards or to read compaction progress, so memwal
reads the files itself:

* a shard's latest manifest is found as Lance does it: read ``version_hint.json``, then
  probe forward version by version until one is missing (HEAD requests, no listing); a store
  that has found a shard's latest version before starts from it instead of the hint (two
  HEADs when nothing changed: it still exists, the next one does not);
* ``compacted_sstables`` and ``index_catchup`` live in the base table manifest's index
  section, in the ``__lance_mem_wal`` index's details, which ``mem_wal_index_details()``
  does not return.

Manifest versions are immutable, so parsed ones are cached per store.
"""

from __future__ import annotations

import json
import struct
import uuid
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from memwal.core import paths
from memwal.core.cache import ByteLRU
from google.protobuf.message import DecodeError

from memwal.core.errors import ManifestError, TableDamagedError
from memwal.core.io import FileIO
from memwal.proto import pb

MEM_WAL_INDEX_NAME = "__lance_mem_wal"
MEM_WAL_DETAILS_TYPE = "/lance.table.MemWalIndexDetails"
_LANCE_MAGIC = b"LANC"


def _uuid_str(msg: pb.UUID) -> str:
    return str(uuid.UUID(bytes=bytes(msg.uuid)))


@dataclass(frozen=True)
class SsTable:
    """One flushed MemTable generation listed in a shard manifest."""

    generation: int
    path: str  # directory name under the shard directory
    in_memory_bytes: int = 0
    physical_rows: int = 0
    primary_key_bytes: int | None = None


@dataclass(frozen=True)
class ShardManifest:
    """One version of a shard's manifest (``ShardManifest`` protobuf)."""

    shard_id: str
    version: int
    writer_epoch: int = 0
    replay_after_wal_entry_position: int = 0
    wal_entry_position_last_seen: int = 0
    current_generation: int = 1
    sstables: tuple[SsTable, ...] = ()
    shard_spec_id: int = 0
    field_entries: Mapping[str, bytes] = field(default_factory=lambda: MappingProxyType({}))
    sealed: bool = False

    @classmethod
    def from_bytes(cls, data: bytes) -> "ShardManifest":
        m = pb.ShardManifest()
        m.ParseFromString(data)
        return cls(
            shard_id=_uuid_str(m.shard_id),
            version=m.version,
            writer_epoch=m.writer_epoch,
            replay_after_wal_entry_position=m.replay_after_wal_entry_position,
            wal_entry_position_last_seen=m.wal_entry_position_last_seen,
            current_generation=m.current_generation,
            sstables=tuple(
                SsTable(
                    s.generation,
                    s.path,
                    s.in_memory_bytes,
                    s.physical_rows,
                    s.primary_key_bytes if s.HasField("primary_key_bytes") else None,
                )
                for s in m.sstables
            ),
            shard_spec_id=m.shard_spec_id,
            field_entries=MappingProxyType({e.field_id: bytes(e.value) for e in m.shard_field_entries}),
            sealed=m.status == pb.SEALED,
        )

    def to_bytes(self) -> bytes:
        m = pb.ShardManifest(
            version=self.version,
            writer_epoch=self.writer_epoch,
            replay_after_wal_entry_position=self.replay_after_wal_entry_position,
            wal_entry_position_last_seen=self.wal_entry_position_last_seen,
            current_generation=self.current_generation,
            shard_spec_id=self.shard_spec_id,
            status=pb.SEALED if self.sealed else pb.ACTIVE,
        )
        m.shard_id.uuid = uuid.UUID(self.shard_id).bytes
        for s in self.sstables:
            t = m.sstables.add(
                generation=s.generation,
                path=s.path,
                in_memory_bytes=s.in_memory_bytes,
                physical_rows=s.physical_rows,
            )
            if s.primary_key_bytes is not None:
                t.primary_key_bytes = s.primary_key_bytes
        for k, v in sorted(self.field_entries.items()):
            m.shard_field_entries.add(field_id=k, value=v)
        return m.SerializeToString()


@dataclass(frozen=True)
class MemWalIndex:
    """The MemWAL index details recorded in one base table version."""

    base_version: int
    num_shards: int
    sharding_specs: tuple[dict, ...]
    maintained_indexes: tuple[str, ...]
    maintain_all_indexes: bool
    #: shard id -> highest generation compacted into the base table
    compacted: Mapping[str, int]
    #: index name -> shard id -> highest compacted generation the index covers
    index_catchup: Mapping[str, Mapping[str, int]]
    writer_config_defaults: Mapping[str, str]

    @classmethod
    def from_details(cls, base_version: int, data: bytes) -> "MemWalIndex":
        d = pb.MemWalIndexDetails()
        d.ParseFromString(data)
        return cls(
            base_version=base_version,
            num_shards=d.num_shards,
            sharding_specs=tuple(
                {
                    "spec_id": s.spec_id,
                    "fields": [
                        {
                            "field_id": f.field_id,
                            "source_ids": list(f.source_ids),
                            "transform": f.transform if f.HasField("transform") else None,
                            "expression": f.expression if f.HasField("expression") else None,
                            "result_type": f.result_type,
                            "parameters": dict(f.parameters),
                        }
                        for f in s.fields
                    ],
                }
                for s in d.sharding_specs
            ),
            maintained_indexes=tuple(d.maintained_indexes),
            maintain_all_indexes=d.maintain_all_indexes if d.HasField("maintain_all_indexes") else False,
            compacted=MappingProxyType({_uuid_str(c.shard_id): c.generation for c in d.compacted_sstables}),
            index_catchup=MappingProxyType(
                {
                    p.index_name: MappingProxyType({_uuid_str(c.shard_id): c.generation for c in p.caught_up_generations})
                    for p in d.index_catchup
                }
            ),
            writer_config_defaults=MappingProxyType(dict(d.writer_config_defaults)),
        )

    def compacted_generation(self, shard_id: str) -> int:
        """Highest generation of ``shard_id`` already in the base table (0: none)."""
        return self.compacted.get(shard_id, 0)


def decode_index_section(manifest_file: bytes) -> list[pb.IndexMetadata]:
    """The index metadata of a Lance base table manifest file (empty if it has none)."""
    if len(manifest_file) < 16 or manifest_file[-4:] != _LANCE_MAGIC:
        raise ManifestError("not a Lance manifest file (missing LANC footer)")
    (manifest_pos,) = struct.unpack("<q", manifest_file[-16:-8])
    manifest = pb.TableManifest()
    manifest.ParseFromString(_length_prefixed(manifest_file, manifest_pos))
    if not manifest.HasField("index_section"):
        return []
    section = pb.IndexSection()
    section.ParseFromString(_length_prefixed(manifest_file, manifest.index_section))
    return list(section.indices)


def _length_prefixed(buf: bytes, pos: int) -> bytes:
    (n,) = struct.unpack("<I", buf[pos : pos + 4])
    return buf[pos + 4 : pos + 4 + n]


class ManifestStore:
    """Reads (and, for shard creation and GC, writes) MemWAL manifests of one table."""

    #: Probing a version past the hint costs one HEAD per version; this bounds a runaway loop
    #: on a corrupt hint without limiting real tables (manifests change on flush, not write).
    MAX_PROBE = 1_000_000
    #: Bound of each of the two manifest caches (shard manifests, MemWAL index details).
    CACHE_BYTES = 32 << 20

    def __init__(self, table_uri: str, io: FileIO) -> None:
        self.table_uri = paths.normalize_uri(table_uri)
        self.io = io
        # Manifests are immutable once written; bounded by the bytes of the files read.
        self._shards: ByteLRU[tuple[str, int], ShardManifest] = ByteLRU(self.CACHE_BYTES)
        #: base version -> (its MemWAL index, the bytes it is counted as)
        self._indexes: ByteLRU[int, tuple[MemWalIndex | None, int]] = ByteLRU(self.CACHE_BYTES)
        #: Shards already seen with a manifest: GC keeps a shard's newest manifest, so one need
        #: not be checked again (a shard read back without one is skipped by every caller).
        self._known_shards: set[str] = set()
        #: shard id -> the latest manifest version found last time: where the next probe starts
        self._latest: dict[str, int] = {}

    def clear_cache(self) -> None:
        self._shards.clear()
        self._indexes.clear()
        self._known_shards.clear()
        self._latest.clear()

    # -- shards ---------------------------------------------------------------------------

    def list_shards(self) -> list[str]:
        """Shard ids: every UUID-named directory under ``_mem_wal/`` that has a manifest.

        One listing of ``_mem_wal/``, not of each shard's manifest directory: that one holds
        every retained manifest version (thousands an hour per shard), and every snapshot
        (each reader refresh) lists the shards. A shard's ``version_hint.json`` is written
        after its first manifest, so one HEAD answers for an established shard; only one
        without a hint (new, or its hint lost) is listed.
        """
        out = []
        for name in self.io.list_dir(paths.mem_wal_root(self.table_uri)):
            try:
                uuid.UUID(name)
            except ValueError:
                continue
            if name in self._known_shards or self._has_manifest(name):
                self._known_shards.add(name)
                out.append(name)
        return out

    def _has_manifest(self, shard_id: str) -> bool:
        if self.io.exists(paths.shard_version_hint_path(self.table_uri, shard_id)):
            return True
        return any(n.endswith(paths.MANIFEST_SUFFIX) for n in self.io.list_dir(paths.shard_manifest_dir(self.table_uri, shard_id)))

    def _hint(self, shard_id: str) -> int:
        try:
            raw = self.io.read(paths.shard_version_hint_path(self.table_uri, shard_id))
            return max(1, int(json.loads(raw)["version"]))
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            return 1

    def latest_version(self, shard_id: str) -> int | None:
        """The shard's latest manifest version, or None if it has none."""
        exists = lambda n: self.io.exists(paths.shard_manifest_path(self.table_uri, shard_id, n))  # noqa: E731
        # Versions are written in order and the newest are never removed: the version found
        # last time, if it still exists, is as good a start as the hint (and one GET less).
        v = self._latest.get(shard_id)
        if v is None or not exists(v):
            v = self._hint(shard_id)
            found = exists(v)
        else:
            found = True
        if not found:
            # A hint may point past a version that GC removed, or be ahead of a crashed write;
            # fall back to scanning from the oldest retained version.
            names = self.io.list_dir(paths.shard_manifest_dir(self.table_uri, shard_id))
            versions = sorted(paths.parse_bitrev64(n) for n in names if n.endswith(paths.MANIFEST_SUFFIX))
            if not versions:
                return None
            v = versions[-1]
        for _ in range(self.MAX_PROBE):
            if not exists(v + 1):
                self._latest[shard_id] = v
                return v
            v += 1
        raise ManifestError(f"shard {shard_id}: more than {self.MAX_PROBE} manifest versions past the hint")

    def read_shard(self, shard_id: str, version: int | None = None) -> ShardManifest | None:
        """A shard manifest (latest if ``version`` is None), or None if the shard has none."""
        if version is None:
            version = self.latest_version(shard_id)
            if version is None:
                return None
        key = (shard_id, version)
        cached = self._shards.get(key)
        if cached is not None:
            return cached
        path = paths.shard_manifest_path(self.table_uri, shard_id, version)
        try:
            data = self.io.read(path)
        except FileNotFoundError:
            return None
        try:
            m = ShardManifest.from_bytes(data)
        except (DecodeError, ValueError) as e:
            # ValueError: a shard id that is not 16 bytes, e.g. an empty (0-byte) file
            raise TableDamagedError(
                f"shard {shard_id}: manifest version {version} ({path}, {len(data)} bytes) cannot be decoded ({e}); "
                "the table needs repair"
            ) from None
        if m.version != version or m.shard_id != shard_id:
            raise TableDamagedError(
                f"shard {shard_id}: manifest file {path} holds shard {m.shard_id} version {m.version}, "
                f"not version {version}; the table needs repair"
            )
        return self._shards.put(key, m, len(data))

    def retained_versions(self, shard_id: str) -> list[int]:
        """Every manifest version still on disk for the shard, ascending."""
        names = self.io.list_dir(paths.shard_manifest_dir(self.table_uri, shard_id))
        return sorted(paths.parse_bitrev64(n) for n in names if n.endswith(paths.MANIFEST_SUFFIX))

    def write_shard_if_absent(self, manifest: ShardManifest) -> bool:
        """Commit ``manifest`` as its version with put-if-not-exists; False if that version exists.

        Then best-effort update of ``version_hint.json``, as Lance does.
        """
        path = paths.shard_manifest_path(self.table_uri, manifest.shard_id, manifest.version)
        if not self.io.write_if_absent(path, manifest.to_bytes()):
            return False
        try:
            hint_path = paths.shard_version_hint_path(self.table_uri, manifest.shard_id)
            if self._hint(manifest.shard_id) < manifest.version:
                self.io.write(hint_path, json.dumps({"version": manifest.version}).encode())
        except OSError:
            pass  # the hint is only a starting point for probing
        return True

    # -- MemWAL index -----------------------------------------------------------------------

    def mem_wal_index(self, base_version: int) -> MemWalIndex | None:
        """The MemWAL index details of a base table version (None if MemWAL is not initialized).

        One cache call: a reader's refresh thread and its reads may ask at once, and a check
        followed by a get could see the entry evicted in between and answer None."""
        return self._indexes.get_or_load(base_version, lambda: self._read_mem_wal_index(base_version), lambda e: e[1])[0]

    def _read_mem_wal_index(self, base_version: int) -> tuple[MemWalIndex | None, int]:
        """The version's MemWAL index from its manifest file, and the bytes the cache counts it as."""
        data = None
        for path in (
            paths.base_manifest_path(self.table_uri, base_version),
            paths.base_manifest_path_v1(self.table_uri, base_version),
        ):
            try:
                data = self.io.read(path)
                break
            except FileNotFoundError:
                continue
        if data is None:
            raise ManifestError(f"base table version {base_version} has no manifest file under {self.table_uri}")
        result, size = None, 256
        for idx in decode_index_section(data):
            if idx.name == MEM_WAL_INDEX_NAME:
                if idx.index_details.type_url != MEM_WAL_DETAILS_TYPE:
                    raise ManifestError(f"unexpected MemWAL index details type {idx.index_details.type_url!r}")
                result = MemWalIndex.from_details(base_version, bytes(idx.index_details.value))
                size += len(idx.index_details.value)
                break
        # The base manifest file is read whole, but only its MemWAL details are kept.
        return result, size
