"""Operating memwal: Prometheus metrics scraped over real HTTP, ``memwal health``, the Grafana
dashboard's structure. The ingest side (a real broker and Spark) is in test_observe_ingest.py."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from helpers import PEOPLE, people, run_sink_batch
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from test_wal_gaps import remove_entry, stranded

from memwal import Table
from memwal.maintain.health import CHECKS, HealthConfig, table_health
from memwal.maintain.maintenance import Maintenance
from memwal.core.metadata import Bounds, WriterConfig
from memwal.observe.maintenance import MaintenanceObserver
from memwal.observe.server import MetricsServer
from memwal.observe.table_health import TableCollector, TableMetricsConfig
from memwal.core.state import TableState

DASHBOARD = Path(__file__).resolve().parent.parent / "docs" / "grafana" / "memwal.json"


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of one real scrape: (name, sorted labels) -> value."""
    with urllib.request.urlopen(url, timeout=30) as r:
        assert r.status == 200
        text = r.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: dict, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def per_shard(samples: dict, name: str) -> dict[str, float]:
    return {dict(labels)["shard"]: v for (n, labels), v in samples.items() if n == name}


def _write(table: Table, ids: range, tag: str = "v") -> None:
    table.write(people(ids, tag))
    table.flush()


def test_table_and_maintenance_metrics_follow_what_happened(table_uri):
    table = Table.create(table_uri, PEOPLE, ["id"], "bucket(id, 2)")
    _write(table, range(0, 300))
    _write(table, range(300, 500))  # two flushes: two SSTables per shard
    registry = CollectorRegistry()
    TableCollector(table_uri, registry=registry, config=TableMetricsConfig(interval_seconds=0, health_interval_seconds=0))
    service = Maintenance(table_uri)
    service.observers.append(MaintenanceObserver(registry))
    with MetricsServer(registry, 0) as server:
        before = scrape(server.url)
        assert value(before, "memwal_table_up") == 1
        assert per_shard(before, "memwal_shard_pending_sstables") == {s: 2 for s in table.manifests.list_shards()}
        assert value(before, "memwal_compaction_debt_rows") == 500
        assert sum(per_shard(before, "memwal_shard_compaction_debt_rows").values()) == 500
        assert all(v > 0 for v in per_shard(before, "memwal_shard_wal_bytes").values())
        assert value(before, "memwal_base_rows") == 0
        assert value(before, "memwal_health_check", check="maintenance") == 0  # never ran
        assert value(before, "memwal_healthy") == 0
        assert ("memwal_maintenance_last_cycle_age_seconds", ()) not in before

        report = service.run_cycle()
        after = scrape(server.url)
        assert value(after, "memwal_maintenance_cycles_total") == 1
        assert value(after, "memwal_maintenance_compacted_rows_total") == 500 == report.rows_compacted
        assert value(after, "memwal_maintenance_generations_compacted_total") == 4
        assert value(after, "memwal_maintenance_cycle_seconds_count") == 1
        assert value(after, "memwal_maintenance_cycle_seconds_sum") == pytest.approx(report.seconds)
        assert set(per_shard(after, "memwal_shard_pending_sstables").values()) == {0}
        assert value(after, "memwal_compaction_debt_rows") == 0
        assert value(after, "memwal_base_rows") == 500
        assert set(per_shard(after, "memwal_shard_compacted_generation").values()) == {2}
        assert 0 <= value(after, "memwal_maintenance_last_cycle_age_seconds") < 600
        assert value(after, "memwal_maintenance_last_cycle_failed") == 0
        assert value(after, "memwal_health_check", check="maintenance") == 1
        assert value(after, "memwal_healthy") == 1
        assert value(after, "memwal_index_lag_generations", index="id_idx") == 0
        assert value(after, "memwal_maintenance_reclaimed_bytes_total") == report.bytes_reclaimed


def _port_of(process: subprocess.Popen) -> str:
    """The metrics URL a CLI process names on stderr."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        m = re.search(r"metrics on (http://127\.0\.0\.1:\d+/metrics)", line)
        if m:
            return m.group(1)
        if not line and process.poll() is not None:
            break
    raise AssertionError(f"no metrics URL on stderr (exit {process.poll()})")


def wait_for(url: str, check, timeout: float = 120.0) -> dict:
    """Scrape until ``check(samples)`` holds (the table is sampled every few seconds)."""
    deadline = time.monotonic() + timeout
    while True:
        samples = scrape(url)
        if check(samples):
            return samples
        if time.monotonic() > deadline:
            raise AssertionError(f"scrapes never satisfied the check; last: {sorted(k for k in samples if 'shard' in k[0])}")
        time.sleep(0.5)


def test_memwal_maintain_serves_metrics_while_it_runs(table_uri):
    """``memwal maintain --metrics-port 0``: SSTables pending after each flush, a cycle counter
    that keeps counting, and the last cycle's age (with --no-compact, so the SSTables stay
    pending: a fold schedule does not wait while the base is empty)."""
    table = Table.create(table_uri, PEOPLE, ["id"], "bucket(id, 2)")
    _write(table, range(0, 100))
    shards = table.manifests.list_shards()
    service = subprocess.Popen(
        [sys.executable, "-m", "memwal", "maintain", table_uri, "--metrics-port", "0", "--interval", "0.2",
         "--no-compact"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        url = _port_of(service)
        first = wait_for(url, lambda s: s.get(("memwal_maintenance_cycles_total", ()), 0) >= 1)
        assert per_shard(first, "memwal_shard_pending_sstables") == {s: 1 for s in shards}
        _write(table, range(100, 200))
        later = wait_for(url, lambda s: set(per_shard(s, "memwal_shard_pending_sstables").values()) == {2})
        assert value(later, "memwal_compaction_debt_rows") == 200
        cycles = value(later, "memwal_maintenance_cycles_total")
        again = wait_for(url, lambda s: s[("memwal_maintenance_cycles_total", ())] > cycles)
        assert value(again, "memwal_maintenance_cycle_failures_total") == 0
        assert value(again, "memwal_maintenance_compacted_rows_total") == 0
        assert value(again, "memwal_maintenance_last_cycle_age_seconds") < 120
    finally:
        service.terminate()
        service.wait(60)


def _memwal(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "memwal", *args], capture_output=True, text=True)


def test_health_exit_codes_follow_maintenance_staleness_and_failures(table_uri):
    table = Table.create(table_uri, PEOPLE, ["id"], "bucket(id, 2)")
    _write(table, range(50))
    never = _memwal("health", table_uri, "--json")
    assert never.returncode == 3
    doc = json.loads(never.stdout)
    assert doc["ok"] is False and [c["name"] for c in doc["checks"]] == list(CHECKS)
    assert {c["name"]: c["ok"] for c in doc["checks"]} == {"maintenance": False, "sstables": True, "wal": True, "files": True}

    Maintenance(table_uri).run_cycle()
    assert _memwal("health", table_uri).returncode == 0
    stale = _memwal("health", table_uri, "--max-maintenance-age", "0")
    assert stale.returncode == 3 and "maintenance" in stale.stdout.splitlines()[-1]
    shallow = json.loads(_memwal("health", table_uri, "--shallow", "--json").stdout)
    assert {c["name"]: c["ok"] for c in shallow["checks"]}["wal"] is None


def test_health_finds_a_wal_gap_and_a_stalled_shard(tmp_path):
    gap_uri = str(tmp_path / "gap")
    table, shard, first = stranded(gap_uri)
    remove_entry(gap_uri, shard, first)
    report = table_health(TableState.load(gap_uri), HealthConfig(max_maintenance_age_seconds=1e9))
    assert report.check("wal").ok is False and report.check("files").ok is True
    assert not report.ok

    stall_uri = str(tmp_path / "stall")
    bounds = Bounds(max_sstables=1, slowdown_sstables=2, stop_sstables=3, stall_timeout_seconds=600.0,
                    max_slowdown_seconds=0.0, recheck_seconds=0.02)
    stalled = Table.create(stall_uri, PEOPLE, ["id"], "unsharded", bounds=bounds, writer=WriterConfig(max_memtable_rows=1000))
    for i in range(3):
        _write(stalled, range(i * 5, i * 5 + 5))
    report = table_health(TableState.load(stall_uri))
    assert report.check("sstables").ok is False
    assert report.check("wal").ok is True
    cli = _memwal("health", stall_uri)
    assert cli.returncode == 3 and "sstables" in cli.stdout.splitlines()[-1]


def test_a_table_that_cannot_be_read_scrapes_as_down(tmp_path):
    registry = CollectorRegistry()
    TableCollector(str(tmp_path / "missing"), registry=registry)
    with MetricsServer(registry, 0) as server:
        samples = scrape(server.url)
    assert samples == {("memwal_table_up", ()): 0.0}


def test_the_dashboard_is_an_importable_grafana_dashboard():
    """The structure Grafana's importer needs: a title, a schemaVersion, a Prometheus
    datasource input, panels with grid positions and unique ids, each with targets whose
    ``expr`` is PromQL over memwal's series (their names are checked against a real scrape in
    test_observe_ingest.py)."""
    doc = json.loads(DASHBOARD.read_text())
    assert isinstance(doc["title"], str) and doc["title"]
    assert isinstance(doc["schemaVersion"], int) and doc["schemaVersion"] >= 36
    assert doc["uid"] and isinstance(doc.get("tags", []), list)
    inputs = {i["name"]: i for i in doc["__inputs"]}
    assert inputs["DS_PROMETHEUS"]["type"] == "datasource" and inputs["DS_PROMETHEUS"]["pluginId"] == "prometheus"
    panels = [p for p in doc["panels"]]
    panels += [q for p in doc["panels"] if p.get("type") == "row" for q in p.get("panels", [])]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    graphs = [p for p in panels if p["type"] != "row"]
    assert len(graphs) >= 8
    for p in graphs:
        assert p["type"] in {"timeseries", "stat", "gauge", "table", "bargauge"}, p["type"]
        assert {"h", "w", "x", "y"} <= set(p["gridPos"]) and 0 <= p["gridPos"]["x"] < 24
        assert p["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["refId"] and re.search(r"\bmemwal_\w+", t["expr"]), (p["title"], t)
            assert t["expr"].count("(") == t["expr"].count(")"), t["expr"]
    titles = " ".join(p["title"].lower() for p in graphs)
    for topic in ("ingest", "lag", "fresh", "debt", "sstables", "maintenance"):
        assert topic in titles, topic


def dashboard_series() -> set[str]:
    """Every series name the dashboard's queries read."""
    doc = json.loads(DASHBOARD.read_text())
    panels = doc["panels"] + [q for p in doc["panels"] if p.get("type") == "row" for q in p.get("panels", [])]
    return {name for p in panels for t in p.get("targets", []) for name in re.findall(r"\bmemwal_\w+", t["expr"])}


def test_the_same_registry_serves_two_scrapes_of_unchanged_values(table_uri):
    """A cached sample answers a second scrape inside the interval (one table read, not two)."""
    table = Table.create(table_uri, PEOPLE, ["id"], "unsharded")
    _write(table, range(10))
    registry = CollectorRegistry()
    collector = TableCollector(table_uri, registry=registry, config=TableMetricsConfig(interval_seconds=3600, health=None))
    with MetricsServer(registry, 0) as server:
        first = scrape(server.url)
        _write(table, range(10, 20))
        second = scrape(server.url)
    assert first == second
    assert collector.sample().status.shards[0].pending_sstables == 1


def test_the_sink_stages_carry_kafka_timestamps_and_never_a_tables_own_timestamp_column(tmp_path):
    """The prepare and write stages (run here as Spark runs them in a worker) put the Kafka
    records' oldest and newest timestamp on the write task's summary, which offset-to-visible
    latency is measured from; a DataFrame of the table's columns whose event-time column is
    named ``timestamp`` carries none (its values are not when Kafka took the records)."""
    import pyarrow as pa

    from memwal.streaming import SinkOptions
    from memwal.write.worker import WORKER

    schema = pa.schema([("event_id", pa.int64()), ("timestamp", pa.timestamp("us", tz="UTC")), ("kind", pa.string())])
    uri = str(tmp_path / "events")
    Table.create(uri, schema, ["event_id"], "bucket(event_id, 2)").close()
    t0 = 1_764_000_000_000  # epoch ms
    kafka = pa.table({
        "key": pa.array([str(i).encode() for i in range(20)], pa.binary()),
        "value": pa.array([json.dumps({"event_id": i, "timestamp": "2026-11-01T00:00:00Z", "kind": "click"}).encode()
                           for i in range(20)], pa.binary()),
        "topic": ["events"] * 20,
        "partition": pa.array([0] * 20, pa.int32()),
        "offset": pa.array(range(20), pa.int64()),
        "timestamp": pa.array([t0 + 1000 * i for i in range(20)], pa.timestamp("ms", tz="UTC")),
    })
    own = pa.table({"event_id": list(range(20, 40)),
                    "timestamp": pa.array([t0 - 86_400_000] * 20, pa.timestamp("ms", tz="UTC")).cast(pa.timestamp("us", tz="UTC")),
                    "kind": ["view"] * 20}).cast(schema)

    try:
        report = run_sink_batch(uri, SinkOptions(source="kafka-json", max_write_tasks=1, flush_interval_seconds=None, writer_process=False),
                                kafka, 0)
        assert report.rows == 20
        assert (report.oldest_record_ms, report.newest_record_ms) == (t0, t0 + 19_000)
        report = run_sink_batch(uri, SinkOptions(source="columns", max_write_tasks=1, flush_interval_seconds=None, writer_process=False),
                                own, 1)
        assert report.rows == 20
        assert report.oldest_record_ms is None and report.newest_record_ms is None
    finally:
        WORKER.clear()
    from memwal.readers import Reader

    stored = Reader(TableState.load(uri), consistency="strong").scan(columns=["event_id", "timestamp"]).to_pylist()
    assert len(stored) == 40
    # The table's own column is the user's event time, written as given.
    assert {r["timestamp"].year for r in stored if r["event_id"] >= 20} == {2025}
