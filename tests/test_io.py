"""The storage seam: storage options resolution, and one FileIO contract on a local disk, on S3 (moto) and
in memory, plus plain Lance on s3:// with the options memwal renders."""

from __future__ import annotations

import pickle
import threading
import time

import lance
import pyarrow as pa
import pytest
from obstore.exceptions import UnknownConfigurationKeyError
from obstore.store import from_url

from memwal.core import paths
from memwal.core.io import FileIO, LocalFileIO, ObjectInfo, ObjectStoreFileIO, file_io_for, split_uri
from memwal.core.storage import (
    ENVIRONMENT_VARIABLES,
    RetryPolicy,
    StorageConfig,
    StorageOptionError,
    UnsupportedSchemeError,
    parse_storage_option_args,
)

# --- storage options -------------------------------------------------------------------------------------


def test_environment_variables_become_lance_keys_with_sdk_precedence():
    env = {
        "AWS_ACCESS_KEY_ID": "id",
        "AWS_SECRET_ACCESS_KEY": "secret",
        "AWS_DEFAULT_REGION": "eu-west-1",
        "AWS_REGION": "us-east-2",
        "AWS_ENDPOINT": "http://old:1",
        "AWS_ENDPOINT_URL": "http://new:2",
        "AWS_ALLOW_HTTP": "true",
        "AWS_SESSION_TOKEN": "",  # set but empty: not an option
        "GOOGLE_SERVICE_ACCOUNT_PATH": "/sa.json",
        "AZURE_STORAGE_ACCOUNT_NAME": "acct",
        "AZURE_STORAGE_ACCOUNT_KEY": "azkey",
        "UNRELATED": "x",
    }
    assert StorageConfig.resolve(environ=env).options == {
        "aws_access_key_id": "id",
        "aws_secret_access_key": "secret",
        "aws_region": "us-east-2",
        "aws_endpoint": "http://new:2",
        "allow_http": "true",
        "google_service_account": "/sa.json",
        "azure_storage_account_name": "acct",
        "azure_storage_account_key": "azkey",
    }


def test_explicit_options_win_over_the_environment_key_by_key():
    env = {"AWS_ENDPOINT": "http://env:1", "AWS_REGION": "env-region", "AWS_ACCESS_KEY_ID": "env-id"}
    cfg = StorageConfig.resolve({"AWS_Endpoint_URL": "http://explicit:2", "aws_region": "explicit-region"}, environ=env)
    # aws_endpoint_url and AWS_ENDPOINT are one setting: the explicit one replaces it, not joins it.
    assert cfg.options == {"aws_endpoint": "http://explicit:2", "aws_region": "explicit-region", "aws_access_key_id": "env-id"}
    assert cfg.get("AWS_ENDPOINT_URL") == "http://explicit:2"


def test_resolve_reads_os_environ_by_default(monkeypatch):
    for var, _ in ENVIRONMENT_VARIABLES:
        monkeypatch.delenv(var, raising=False)
    assert StorageConfig.resolve().options == {}
    retry = RetryPolicy().client_options()
    assert StorageConfig.resolve().lance_options() == retry  # the retry bounds go to Lance even without options
    monkeypatch.setenv("AWS_REGION", "ap-south-1")
    assert StorageConfig.resolve().lance_options() == {**retry, "aws_region": "ap-south-1"}
    assert StorageConfig.resolve({"aws_region": "x"}, environ={}).options == {"aws_region": "x"}


def test_cli_key_value_strings():
    assert parse_storage_option_args(["aws_region=us-east-1", "AWS_SESSION_TOKEN=a=b==", "allow_http=true", "aws_region=eu"]) == {
        "aws_region": "eu",  # a later flag wins
        "aws_session_token": "a=b==",  # only the first '=' separates
        "allow_http": "true",
    }
    assert parse_storage_option_args(["timeout="]) == {"timeout": ""}
    for bad in ["aws_region", "=value", " =x", ""]:
        with pytest.raises(StorageOptionError, match=f"storage option {bad!r} is not KEY=VALUE"):
            parse_storage_option_args(["allow_http=true", bad])
    cfg = StorageConfig.from_args(["aws_region=cli"], environ={"AWS_REGION": "env", "AWS_ACCESS_KEY_ID": "id"})
    assert cfg.options == {"aws_region": "cli", "aws_access_key_id": "id"}


def test_config_is_immutable_hashable_picklable_and_hides_secrets():
    cfg = StorageConfig.resolve({"aws_secret_access_key": "s3cr3t", "aws_session_token": "t0k3n", "aws_region": "r"}, environ={})
    assert pickle.loads(pickle.dumps(cfg)) == cfg
    same = StorageConfig.resolve({"aws_region": "r", "aws_session_token": "t0k3n", "aws_secret_access_key": "s3cr3t"}, environ={})
    assert hash(cfg) == hash(same) and cfg == same
    text = repr(cfg)
    assert "s3cr3t" not in text and "t0k3n" not in text
    assert "aws_region='r'" in text and "aws_secret_access_key=***" in text
    with pytest.raises(AttributeError):
        cfg.items = ()  # type: ignore[misc]


def test_obstore_rendering_gives_each_store_only_its_own_keys():
    cfg = StorageConfig.resolve(
        {
            "aws_endpoint": "http://127.0.0.1:9",
            "aws_region": "us-east-1",
            "google_service_account": "/sa.json",
            "azure_storage_account_name": "acct",
            "allow_http": "true",
            "connect_timeout": "5s",
            "client_max_retries": "3",
            "client_retry_timeout": "20",
            "download_retry_count": "2",  # Lance-only: obstore has no equivalent
        },
        environ={},
    )
    s3 = cfg.obstore_kwargs("s3")
    assert s3["config"] == {"aws_endpoint": "http://127.0.0.1:9", "aws_region": "us-east-1"}
    assert s3["client_options"] == {"allow_http": "true", "connect_timeout": "5s", "timeout": RetryPolicy.request_timeout}
    assert s3["retry_config"]["max_retries"] == 3 and s3["retry_config"]["retry_timeout"].total_seconds() == 20
    assert cfg.obstore_kwargs("gs")["config"] == {"google_service_account": "/sa.json"}
    assert cfg.obstore_kwargs("az")["config"] == {"azure_storage_account_name": "acct"}
    assert "config" not in cfg.obstore_kwargs("memory")
    with pytest.raises(StorageOptionError, match="client_max_retries='many'"):
        StorageConfig.resolve({"client_max_retries": "many"}, environ={}).obstore_kwargs("s3")


def test_every_environment_variable_renders_to_a_key_obstore_accepts():
    """obstore rejects unknown keys, so each key memwal reads from the environment must be a real one."""
    env = {var: "1" for var, _ in ENVIRONMENT_VARIABLES}
    env.update({"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ALLOW_HTTP": "true", "AWS_REGION": "us-east-1"})
    env.update({"AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "false", "AWS_SKIP_SIGNATURE": "false", "AZURE_STORAGE_USE_EMULATOR": "false"})
    env["AZURE_STORAGE_ENDPOINT"] = "http://127.0.0.1:10000/acct"
    cfg = StorageConfig.resolve(environ=env)
    from_url("s3://bucket", **cfg.obstore_kwargs("s3"))
    from_url("az://container", **cfg.obstore_kwargs("az"))
    gcs = cfg.obstore_kwargs("gs")
    assert set(gcs["config"]) == {"google_service_account", "google_service_account_key", "google_application_credentials"}
    # Building a GCS client opens the service-account file named "1": it gets past the keys and fails there.
    with pytest.raises(Exception) as failed:
        from_url("gs://bucket", **gcs)
    assert not isinstance(failed.value, UnknownConfigurationKeyError)
    assert "service account" in str(failed.value)


# --- paths and dispatch ----------------------------------------------------------------------------------


def test_paths_keep_object_store_uris_intact():
    assert paths.normalize_uri("s3://bucket/t/") == "s3://bucket/t"
    assert paths.join("s3://bucket/t", "_mem_wal", "abc/") == "s3://bucket/t/_mem_wal/abc"
    assert paths.shard_manifest_path("s3://b/t", "s", 1).startswith("s3://b/t/_mem_wal/s/manifest/1000")
    assert paths.dead_letter_table("gs://b/t/") == "gs://b/t_dead_letters"
    assert split_uri("s3://bucket/t/_mem_wal/x.binpb") == ("s3", "bucket", "t/_mem_wal/x.binpb")
    assert split_uri("abfss://c@acct.dfs.core.windows.net/t/a#b") == ("abfss", "c@acct.dfs.core.windows.net", "t/a#b")
    assert split_uri("memory:///t") == ("memory", "", "t")


def test_file_io_for_dispatches_on_the_scheme(tmp_path):
    assert isinstance(file_io_for(str(tmp_path)), LocalFileIO)
    assert isinstance(file_io_for(f"file://{tmp_path}"), LocalFileIO)
    for uri in ["s3://bucket/t", "gs://bucket/t", "az://container/t", "abfss://c@a.dfs.core.windows.net/t", "memory:///t"]:
        fio = file_io_for(uri, {"aws_region": "us-east-1"})
        assert isinstance(fio, ObjectStoreFileIO) and isinstance(fio, FileIO)
        assert fio.storage.get("aws_region") == "us-east-1"
    cfg = StorageConfig.resolve({"aws_region": "r"}, environ={})
    assert file_io_for("s3://bucket/t", cfg).storage is cfg
    with pytest.raises(UnsupportedSchemeError, match="hdfs://"):
        file_io_for("hdfs://namenode/t")
    with pytest.raises(StorageOptionError, match="aws_no_such_option"):
        file_io_for("s3://bucket/t", {"aws_no_such_option": "1"}).exists("s3://bucket/t/x")


# --- one FileIO contract, three stores ---------------------------------------------------------------------


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3), "memory"])
def store(request, tmp_path) -> tuple[FileIO, str]:
    """(FileIO, a root path under which the test may do anything)."""
    if request.param == "local":
        return LocalFileIO(), str(tmp_path / "root")
    if request.param == "memory":
        root = f"memory:///{request.node.name}-{time.monotonic_ns()}"
        return file_io_for(root), root
    s3 = request.getfixturevalue("s3_server")
    root = s3.fresh_uri("root")
    return file_io_for(root, StorageConfig.resolve(s3.storage_options(), environ={})), root


def test_read_write_exists_stat(store):
    fio, root = store
    path = paths.join(root, "a", "b.bin")
    assert not fio.exists(path)
    with pytest.raises(FileNotFoundError):
        fio.read(path)
    with pytest.raises(FileNotFoundError):
        fio.stat(path)
    with pytest.raises(FileNotFoundError):
        fio.modified_time(path)
    before = time.time()
    fio.write(path, b"hello")
    assert fio.exists(path) and fio.read(path) == b"hello"
    size, mtime = fio.stat(path)
    assert size == 5
    assert before - 2 <= mtime <= time.time() + 2  # S3 times have 1 s resolution
    assert fio.modified_time(path) == mtime
    fio.write(path, b"replaced!")
    assert fio.read(path) == b"replaced!" and fio.stat(path)[0] == 9


def test_write_if_absent_creates_once(store):
    fio, root = store
    path = paths.join(root, "manifest", "v1.binpb")
    assert fio.write_if_absent(path, b"first")
    assert not fio.write_if_absent(path, b"second")
    assert fio.read(path) == b"first"


def test_racing_write_if_absent_has_exactly_one_winner(store):
    fio, root = store
    path = paths.join(root, "race", "v7.binpb")
    n = 8
    barrier = threading.Barrier(n)
    results: dict[int, bool] = {}
    errors: list[BaseException] = []

    def attempt(i: int) -> None:
        try:
            barrier.wait()
            results[i] = fio.write_if_absent(path, f"writer-{i}".encode())
        except BaseException as e:  # surfaced by the assertion below
            errors.append(e)

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    winners = [i for i, won in results.items() if won]
    assert len(results) == n and len(winners) == 1
    assert fio.read(path) == f"writer-{winners[0]}".encode()


def test_listing_is_a_directory_listing(store):
    fio, root = store
    t = paths.join(root, "t")
    for rel in ["f1", "d1/x", "d1/y/z", "d2/w"]:
        fio.write(paths.join(t, rel), rel.encode())
    fio.write(paths.join(root, "t_dead_letters", "f"), b"sibling")  # shares the name prefix, not the directory
    assert fio.list_dir(t) == ["d1", "d2", "f1"]
    assert fio.list_dir(paths.join(t, "d1")) == ["x", "y"]
    assert fio.list_dir(paths.join(t, "missing")) == []
    assert fio.list_dir(root) == ["t", "t_dead_letters"]

    listed = fio.list_prefix(t)
    assert [(i.path, i.size) for i in listed] == [("d1/x", 4), ("d1/y/z", 6), ("d2/w", 4), ("f1", 2)]
    assert all(isinstance(i, ObjectInfo) for i in listed)
    assert fio.list_prefix(paths.join(t, "missing")) == []
    assert fio.tree_size(t) == 16
    assert fio.newest_modified_time(t) == max(i.mtime for i in listed)
    assert fio.newest_modified_time(paths.join(t, "missing")) is None


def test_newest_modified_time_follows_the_newest_file(store):
    fio, root = store
    d = paths.join(root, "sst")
    fio.write(paths.join(d, "old"), b"o")
    old = fio.newest_modified_time(d)
    time.sleep(1.1)  # object stores keep whole seconds
    fio.write(paths.join(d, "data", "new"), b"n")
    newest = fio.newest_modified_time(d)
    assert old is not None and newest is not None and newest > old
    assert newest == fio.modified_time(paths.join(d, "data", "new"))


def test_remove_and_remove_tree(store):
    fio, root = store
    t = paths.join(root, "t")
    for rel in ["a", "b/c", "b/d/e"]:
        fio.write(paths.join(t, rel), b"x")
    fio.write(paths.join(root, "t_dead_letters", "keep"), b"k")
    fio.remove(paths.join(t, "a"))
    fio.remove(paths.join(t, "a"))  # missing is fine
    assert not fio.exists(paths.join(t, "a"))
    fio.remove_tree(paths.join(t, "b"))
    assert fio.list_prefix(t) == []
    fio.remove_tree(paths.join(t, "b"))  # missing is fine
    assert fio.read(paths.join(root, "t_dead_letters", "keep")) == b"k"


def test_many_objects_remove_tree_and_listing(store):
    fio, root = store
    d = paths.join(root, "many")
    for i in range(30):
        fio.write(paths.join(d, f"w{i // 10}", f"{i:03d}"), b"")
    assert len(fio.list_prefix(d)) == 30 and fio.list_dir(d) == ["w0", "w1", "w2"]
    fio.remove_tree(d)
    assert fio.list_prefix(d) == [] and fio.list_dir(d) == []


def test_file_io_pickles(store):
    fio, root = store
    path = paths.join(root, "p")
    fio.write(path, b"v")
    clone = pickle.loads(pickle.dumps(fio))
    assert clone.read(path) == b"v"


# --- plain Lance on s3:// with memwal's rendered options ---------------------------------------------------


def _round_trip(uri: str, cfg: StorageConfig) -> None:
    opts = cfg.lance_options()
    first = pa.table({"id": pa.array([1, 2, 3], pa.int64()), "v": ["a", "b", "c"]})
    lance.write_dataset(first, uri, storage_options=opts)
    lance.write_dataset(pa.table({"id": pa.array([4], pa.int64()), "v": ["d"]}), uri, mode="append", storage_options=opts)
    ds = lance.dataset(uri, storage_options=opts)
    assert ds.version == 2
    assert sorted(ds.to_table().column("id").to_pylist()) == [1, 2, 3, 4]
    # memwal's own FileIO sees what Lance wrote, through the same options.
    fio = file_io_for(uri, cfg)
    assert fio.list_dir(paths.join(uri, paths.BASE_VERSIONS_DIR))
    assert any(i.path.startswith("data/") for i in fio.list_prefix(uri))


@pytest.mark.s3
def test_lance_on_s3_with_options_from_the_environment_only(s3_env, s3_uri, monkeypatch):
    cfg = StorageConfig.resolve()
    assert cfg.get("aws_endpoint") == s3_env.endpoint and cfg.get("allow_http") == "true"
    # The resolved config carries everything: a process without the variables (an executor) can use it.
    for var, _ in ENVIRONMENT_VARIABLES:
        monkeypatch.delenv(var, raising=False)
    _round_trip(s3_uri, cfg)


@pytest.mark.s3
def test_lance_on_s3_with_explicit_options_only(s3_server, s3_uri, monkeypatch):
    for var, _ in ENVIRONMENT_VARIABLES:
        monkeypatch.delenv(var, raising=False)
    cfg = StorageConfig.from_args([f"{k}={v}" for k, v in s3_server.storage_options().items()])
    assert cfg.options == s3_server.storage_options()
    _round_trip(s3_uri, cfg)


def test_the_retry_policy_is_one_place_for_lance_and_obstore():
    """Lance and memwal's own obstore client get the same bounds; a storage option changes both,
    and memwal's own setting never reaches obstore (which would refuse it)."""
    cfg = StorageConfig.resolve(
        {"client_max_retries": "2", "client_retry_timeout": "7", "timeout": "3s", "memwal_operation_retries": "5"},
        environ={},
    )
    policy = cfg.retry
    assert (policy.max_retries, policy.retry_timeout_seconds, policy.request_timeout, policy.operation_retries) == (2, 7, "3s", 5)
    lance = cfg.lance_options()
    assert lance["client_max_retries"] == "2" and lance["client_retry_timeout"] == "7" and lance["timeout"] == "3s"
    assert RetryPolicy.from_options(lance) == policy  # what is handed only Lance's options still finds it
    s3 = cfg.obstore_kwargs("s3")
    assert s3["retry_config"]["max_retries"] == 2 and s3["retry_config"]["retry_timeout"].total_seconds() == 7
    assert s3["client_options"]["timeout"] == "3s" and "memwal_operation_retries" not in str(s3)
    defaults = RetryPolicy()
    assert StorageConfig.resolve(environ={}).retry == defaults
    assert [defaults.backoff(n) for n in (1, 2, 3)] == [defaults.backoff_seconds * k for k in (1, 2, 4)]
    assert defaults.backoff(100) == defaults.max_backoff_seconds
    with pytest.raises(StorageOptionError, match="memwal_operation_retries"):
        assert StorageConfig.resolve({"memwal_operation_retries": "x"}, environ={}).retry is None
