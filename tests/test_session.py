"""Which master and settings memwal's SparkSession gets: unit tests of the precedence (no
Spark), and one launch through ``PYSPARK_SUBMIT_ARGS`` in a child process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from memwal.cli import build_parser
from memwal.core.runtime import executor_env
from memwal.streaming.session import LOOPBACK, SESSION_DEFAULTS, is_local_master, resolve_master, session_settings


def test_an_explicit_master_wins_over_the_launchers_and_the_default():
    assert resolve_master("spark://h:7077", "yarn", 2) == "spark://h:7077"


def test_the_launchers_master_wins_over_the_default():
    assert resolve_master(None, "local-cluster[2,1,1024]", 2) == "local-cluster[2,1,1024]"
    assert resolve_master(None, "k8s://https://api:6443", 8) == "k8s://https://api:6443"


def test_local_n_only_when_nothing_names_a_master():
    assert resolve_master(None, None, 3) == "local[3]"
    assert resolve_master("", "", "*") == "local[*]"


def test_cores_asked_for_replace_the_launchers_default_master():
    """spark-submit reports local[*] when nothing named a master: cores asked for win over it,
    and only over it."""
    assert resolve_master(None, "local[*]", 3) == "local[3]"
    assert resolve_master(None, "local[*]", None) == "local[*]"
    assert resolve_master(None, "local[4]", 3) == "local[4]"


@pytest.mark.parametrize("master", ["local", "local[2]", "local[*]", "local[4,2]", "local-cluster[2,1,1024]"])
def test_local_masters(master):
    assert is_local_master(master)


@pytest.mark.parametrize("master", ["spark://h:7077", "yarn", "k8s://https://api:6443", "mesos://h:5050", "localhost"])
def test_cluster_masters(master):
    assert not is_local_master(master)


def test_a_local_driver_binds_and_advertises_loopback():
    s = session_settings("local-cluster[2,1,1024]", {}, env={})
    assert s["spark.driver.host"] == LOOPBACK and s["spark.driver.bindAddress"] == LOOPBACK


def test_a_cluster_driver_keeps_its_address():
    s = session_settings("spark://h:7077", {}, env={})
    assert "spark.driver.host" not in s and "spark.driver.bindAddress" not in s


def test_launcher_settings_win_over_memwals_defaults():
    configured = {"spark.sql.shuffle.partitions": "200", "spark.driver.host": "10.0.0.5", "spark.executorEnv.LANCE_LOG": "info"}
    s = session_settings("local[2]", configured, env={"LANCE_LOG": "error"})
    assert not set(configured) & set(s)  # nothing the launcher set is overridden
    assert s["spark.driver.bindAddress"] == LOOPBACK
    assert {k: s[k] for k in SESSION_DEFAULTS if k in s} == {k: v for k, v in SESSION_DEFAULTS.items() if k not in configured}


def test_executors_get_the_process_setup():
    s = session_settings("yarn", {})
    assert {k.removeprefix("spark.executorEnv."): v for k, v in s.items() if k.startswith("spark.executorEnv.")} == executor_env()


def test_ingest_takes_a_master_and_storage_options():
    args = build_parser().parse_args(
        ["ingest", "--bootstrap", "b:9092", "--topic", "t", "--table", "s3://b/t", "--checkpoint", "/c",
         "--master", "local-cluster[2,1,1024]", "--storage-option", "aws_region=eu-west-1"]
    )
    assert args.master == "local-cluster[2,1,1024]" and args.storage_option == ["aws_region=eu-west-1"]
    assert build_parser().parse_args(["ingest", "--bootstrap", "b", "--topic", "t", "--table", "x", "--checkpoint", "c"]).master is None


@pytest.mark.spark
def test_pyspark_submit_args_master_wins_over_the_default(tmp_path):
    """A master given through PYSPARK_SUBMIT_ARGS is the session's; the driver is on loopback."""
    script = (
        "import json; from memwal.streaming import local_session; s = local_session(cores=2); c = s.sparkContext; "
        "print(json.dumps([c.master, c.getConf().get('spark.driver.host'), c.getConf().get('spark.driver.bindAddress'), "
        "c.getConf().get('spark.sql.shuffle.partitions')])); s.stop()"
    )
    env = {**os.environ, "PYSPARK_SUBMIT_ARGS": "--master local[1] --conf spark.sql.shuffle.partitions=7 pyspark-shell"}
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout.strip().splitlines()[-1]) == ["local[1]", LOOPBACK, LOOPBACK, "7"]
