"""Prometheus metrics for memwal: an adapter over its typed records, served on 127.0.0.1.

memwal measures in typed records (:class:`~memwal.streaming.batch_progress.BatchProgress` per
micro-batch, :class:`~memwal.maintain.metrics.MaintenanceMetrics` per maintenance cycle,
:class:`~memwal.maintain.status.TableStatus` and :class:`~memwal.maintain.health.HealthReport` of the table on
storage); this package only turns them into Prometheus series, so a number is measured once
and shown alike by ``memwal status``, the logs and Grafana:

- :mod:`memwal.observe.ingest`: ``memwal_ingest_*``, one update per micro-batch, on the
  driver (the executors' counters arrive in the batch's summary rows);
- :mod:`memwal.observe.maintenance`: ``memwal_maintenance_*`` counters of a service running
  in this process;
- :mod:`memwal.observe.table_health`: the table as it is on storage, sampled at most every few
  seconds when scraped (per shard SSTables, WAL bytes, compaction debt; the base; index lag;
  the age of the last maintenance cycle; health);
- :mod:`memwal.observe.server`: the HTTP endpoint.

Names follow Prometheus conventions (``_total`` counters, ``_seconds``, ``_bytes``); labels
are bounded (shard, index, phase, check, topic and partition; never a key). The list with
what each series means is in README.md ("Metrics"); docs/grafana/memwal.json is a dashboard
over them. Only :mod:`memwal.observe.ingest` imports Spark.
"""

from prometheus_client import disable_created_metrics

# Counters' ``_created`` series would double the exposition; no query of memwal's needs them.
disable_created_metrics()
