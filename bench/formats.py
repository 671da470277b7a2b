"""Decode benchmark of ``memwal ingest``'s value formats, in one run: records per second of
the prepare stage's decoder for each format, as a ratio to the JSON decoder on the same rows
(the baseline), plus Avro decoded by fastavro alone (``AvroDecoder(native=False)``: the path
of schemas Arrow's Avro reader does not take, one value at a time) to show what the native
path saves.

The rows are the workload of docs/benchmarks.md (id, val, name, a 64-float vector); every
format encodes the same rows. No Spark, no Kafka: only the decoding a read task does.

Run: ``python bench/formats.py [--rows N] [--repeat R]``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import pyarrow as pa

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import AVSC, DIM, SCHEMA, base_rows, git_rev, machine, report, today, value_encoder  # noqa: E402

from memwal.streaming.avro import AvroDecoder  # noqa: E402
from memwal.streaming.decode import value_decoder  # noqa: E402

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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=50_000)
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
    report(results, args.json)


if __name__ == "__main__":
    main()
