"""Decode benchmark of ``memwal ingest``'s value formats, in one run: records per second of
the prepare stage's decoder for each format, as a ratio to the JSON decoder on the same rows
(the baseline), plus Avro decoded by fastavro alone (``AvroDecoder(native=False)``: the path
of schemas Arrow's Avro reader does not take, one value at a time) to show what the native
path saves.

The rows are the workload of docs/benchmarks.md (id, val, name, a 64-float vector); every
format encodes the same rows. No Spark, no Kafka: only the decoding a read task does.

**Debezium's defaults** (issue 38), a second set on other rows: change events of a shop's
``orders`` table (decimals, a 38-digit decimal, a variable-scale numeric, timestamps, dates,
a zoned timestamp, an enum, a UUID, JSON; tests/debezium_events.py) as a default PostgreSQL
connector writes them. The baseline is today's schema-less path: the same events without their
schema (``schemas.enable=false``) into columns of the literals' types (decimals as their base64
text, timestamps as numbers), which is all that path can read of them. Against it: the events
with their schema into the natural columns (``decimal128(10,2)``, ``timestamp[us]``,
``date32``...); the same, written with whitespace (the schema read record by record); and
Debezium's Avro envelopes (Arrow's decoder, and fastavro alone).

Run: ``python bench/formats.py [--rows N] [--orders N] [--repeat R]``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

import pyarrow as pa

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import AVSC, DIM, SCHEMA, base_rows, git_rev, machine, report, today, value_encoder  # noqa: E402

from memwal.streaming.avro import AvroDecoder  # noqa: E402
from memwal.streaming.debezium import DebeziumDecoder  # noqa: E402
from memwal.streaming.decode import value_decoder  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
from debezium_events import AvroTopic, orders_table, random_order  # noqa: E402
from registry import Registry  # noqa: E402

#: The orders table as a user creates it from an event (memwal init --schema-from-debezium).
ORDERS = pa.schema([
    ("id", pa.int64()), ("customer", pa.string()), ("amount", pa.decimal128(10, 2)), ("tax", pa.decimal128(38, 9)),
    ("ratio", pa.decimal256(76, 38)), ("created_at", pa.timestamp("us")), ("shipped_on", pa.date32()),
    ("paid_at", pa.timestamp("us", "UTC")), ("status", pa.string()), ("tracking", pa.string()), ("attrs", pa.string()),
    ("note", pa.string()),
])
#: The same columns as today's schema-less path reads the events' literals.
LITERALS = pa.schema([
    ("id", pa.int64()), ("customer", pa.string()), ("amount", pa.string()), ("tax", pa.string()),
    ("ratio", pa.struct([("scale", pa.int32()), ("value", pa.string())])), ("created_at", pa.int64()), ("shipped_on", pa.int32()),
    ("paid_at", pa.string()), ("status", pa.string()), ("tracking", pa.string()), ("attrs", pa.string()), ("note", pa.string()),
])

def encodings(rows: list[dict]) -> dict[str, tuple[list, list]]:
    avro = value_encoder("avro")
    keys = [json.dumps({"id": r["id"]}).encode() for r in rows]
    bare = [avro(r) for r in rows]
    return {
        "json": ([json.dumps({**r, "op": "upsert"}).encode() for r in rows], keys),
        "debezium-json": ([json.dumps({"before": None, "after": r, "op": "u", "ts_ms": 1, "source": {"lsn": 100 + i}}).encode()
                           for i, r in enumerate(rows)], keys),
        "debezium-json (wrapped)": ([json.dumps({"schema": {"type": "struct"}, "payload": {"before": None, "after": r, "op": "u",
                                     "source": {"lsn": 100 + i}}}).encode() for i, r in enumerate(rows)], keys),
        "avro": (bare, keys),
        "avro (Confluent header)": ([b"\x00\x00\x00\x00\x07" + v for v in bare], keys),
        "avro, fastavro only": (bare, keys),
    }


def debezium_runs(n: int, repeat: int, results: dict) -> None:
    """The orders events, decoded by each path (see the module's doc); ratios to the schema-less path."""
    table, rng = orders_table(), random.Random(38)
    rows = [random_order(rng, i, i) for i in range(n)]
    avro = AvroTopic(table)
    registry = Registry({7: avro.value_avro, 8: avro.key_avro})
    try:
        events = [table.event("c", None, r, lsn=24_000_000 + i, commit_ms=1_700_000_000_000 + i, txid=500 + i // 4) for i, r in enumerate(rows)]
        keys = [table.key_of(r) for r in rows]
        bare = [json.dumps(json.loads(e)["payload"], separators=(",", ":")).encode() for e in events]
        spaced = [json.dumps(json.loads(e), indent=1).encode() for e in events]
        avro_values = [avro.event("c", None, r, lsn=24_000_000 + i, commit_ms=1_700_000_000_000 + i, txid=500 + i // 4) for i, r in enumerate(rows)]
        avro_keys = [avro.key_of(r) for r in rows]
        runs = {
            "debezium-json, no schema (today's path; literal columns)": (DebeziumDecoder(LITERALS, ["id"]), bare, keys),
            "debezium-json with its schema (default connector)": (DebeziumDecoder(ORDERS, ["id"]), events, keys),
            "debezium-json with its schema, written with whitespace": (DebeziumDecoder(ORDERS, ["id"]), spaced, keys),
            "avro, Debezium envelopes (Arrow's decoder)": (AvroDecoder(ORDERS, None, None, None, registry=registry.url, primary_key=["id"]),
                                                           avro_values, avro_keys),
            "avro, Debezium envelopes (fastavro only)": (AvroDecoder(ORDERS, None, None, None, registry=registry.url, native=False,
                                                                     primary_key=["id"]), avro_values, avro_keys),
        }
        sizes = {name: sum(len(v) for v in values) / n for name, (_, values, _) in runs.items()}
        section: dict = {"rows": n}
        for name, (decoder, values, ks) in runs.items():
            v, k = pa.array(values, pa.binary()), pa.array(ks, pa.binary())
            best = float("inf")
            for _ in range(repeat):
                t0 = time.perf_counter()
                d = decoder.decode_batch(v, k)
                best = min(best, time.perf_counter() - t0)
                assert not d.errors and d.rows.num_rows == n, (name, list(d.errors.items())[:2])
            section[name] = {"records_per_s": round(n / best), "bytes_per_record": round(sizes[name])}
    finally:
        registry.close()
    base = section["debezium-json, no schema (today's path; literal columns)"]["records_per_s"]
    print(f"\nDebezium's defaults: {n} change events of the orders table, best of {repeat}:")
    for name, r in section.items():
        if isinstance(r, dict):
            r["vs_schemaless"] = round(r["records_per_s"] / base, 2)
            print(f"  {name:58s} {r['records_per_s']:>9,} records/s  {r['vs_schemaless']:.2f}x  ({r['bytes_per_record']:,} bytes/record)")
    results["debezium_defaults"] = section


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=50_000)
    ap.add_argument("--orders", type=int, default=20_000, help="change events of the Debezium section (0: skip it)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", help="write the results here too")
    args = ap.parse_args()
    schema = SCHEMA.append(pa.field("pos", pa.int64()))
    rows = [{k: v for k, v in r.items()} for r in base_rows(args.rows).to_pylist()]
    avsc = json.dumps(AVSC)
    decoders = {
        "json": value_decoder(schema, "json"),
        "debezium-json": value_decoder(schema, "debezium-json", primary_key=["id"], sequence_field="pos"),
        "debezium-json (wrapped)": value_decoder(schema, "debezium-json", primary_key=["id"], sequence_field="pos"),
        "avro": value_decoder(schema, "avro", avro_schema=avsc),
        "avro (Confluent header)": value_decoder(schema, "avro", avro_schema=avsc, avro_schema_id=7),
        "avro, fastavro only": AvroDecoder(schema, avro_schema=avsc, native=False),
    }
    results: dict = {"machine": machine(), "date": today(), "commit": git_rev(), "rows": args.rows, "dim": DIM}
    for name, (values, keys) in encodings(rows).items():
        v, k = pa.array(values, pa.binary()), pa.array(keys, pa.binary())
        best = float("inf")
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            d = decoders[name].decode_batch(v, k)
            best = min(best, time.perf_counter() - t0)
            assert not d.errors and d.rows.num_rows == args.rows
        results[name] = {"records_per_s": round(args.rows / best)}
    base = results["json"]["records_per_s"]
    print(f"decoding {args.rows} records ({DIM}-float vectors), best of {args.repeat}:")
    for name in list(results):
        if isinstance(results[name], dict):
            results[name]["vs_json"] = round(results[name]["records_per_s"] / base, 2)
            print(f"  {name:40s} {results[name]['records_per_s']:>10,} records/s  {results[name]['vs_json']:.2f}x json")
    if args.orders:
        debezium_runs(args.orders, args.repeat, results)
    report(results, args.json)


if __name__ == "__main__":
    main()
