"""The checked-in generated protobuf module matches the .proto it was generated from."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from memwal.proto import pb

ROOT = Path(__file__).resolve().parent.parent


def _build_script():
    spec = importlib.util.spec_from_file_location("proto_build", ROOT / "proto" / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_module_is_up_to_date(tmp_path):
    pytest.importorskip("grpc_tools", reason="grpcio-tools (the dev extra) regenerates the module")
    build = _build_script()
    fresh = build.generate(tmp_path).read_text()
    checked_in = (build.PACKAGE_DIR / "lance_table_pb2.py").read_text()
    assert fresh == checked_in, "run `python proto/build.py` and commit the result"


def test_messages_use_lance_tag_numbers():
    fields = {f.name: f.number for f in pb.ShardManifest.DESCRIPTOR.fields}
    assert fields == {
        "version": 1,
        "writer_epoch": 2,
        "replay_after_wal_entry_position": 3,
        "wal_entry_position_last_seen": 4,
        "current_generation": 6,
        "sstables": 8,
        "shard_spec_id": 10,
        "shard_id": 11,
        "shard_field_entries": 14,
        "status": 15,
    }
    details = {f.name: f.number for f in pb.MemWalIndexDetails.DESCRIPTOR.fields}
    assert details["compacted_sstables"] == 9 and details["index_catchup"] == 10
    assert details["sharding_specs"] == 7 and details["maintained_indexes"] == 8
