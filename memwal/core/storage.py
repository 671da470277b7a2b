"""Storage options: where the credentials and endpoint of a table's object store come from.

One :class:`StorageConfig` is resolved once per table handle, from three sources:

1. the standard environment variables Lance and Rust's ``object_store`` read
   (``AWS_ACCESS_KEY_ID``, ``AWS_ENDPOINT_URL``, ``GOOGLE_SERVICE_ACCOUNT``, ``AZURE_STORAGE_ACCOUNT_NAME``, ...),
2. an explicit ``storage_options`` mapping in Lance's key spelling (``aws_access_key_id``, ``aws_endpoint``,
   ``allow_http``, ...), which wins over the environment key by key,
3. repeatable ``--storage-option KEY=VALUE`` strings on the command line (parsed into 2.).

Keys are canonicalised (lower case, one spelling per setting) so an explicit ``aws_endpoint_url`` overrides an
environment ``AWS_ENDPOINT`` instead of sitting next to it with Lance choosing between them.

The resolved options are rendered twice: for Lance (:meth:`StorageConfig.lance_options`, passed to every
``lance.dataset``/``write_dataset``/MemWAL call) and for obstore (:meth:`StorageConfig.obstore_kwargs`, used by
memwal's own object-store file operations), so both talk to the same store with the same credentials and the
same retry bounds (:class:`RetryPolicy`, the one place they are set). Because the
environment is read once, into the handle, a process that receives the handle (a Spark executor) does not need
the driver's environment.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from memwal.core.errors import MemwalError


class StorageOptionError(MemwalError):
    """A storage option cannot be parsed or does not apply to the table's object store."""


class UnsupportedSchemeError(MemwalError):
    """A table URI names a storage scheme memwal cannot read or write."""


# (environment variable, Lance key). Earlier rows win when two variables set the same key, as in the AWS
# SDKs: AWS_REGION over AWS_DEFAULT_REGION, AWS_ENDPOINT_URL over AWS_ENDPOINT.
ENVIRONMENT_VARIABLES: Final[tuple[tuple[str, str], ...]] = (
    ("AWS_ACCESS_KEY_ID", "aws_access_key_id"),
    ("AWS_SECRET_ACCESS_KEY", "aws_secret_access_key"),
    ("AWS_SESSION_TOKEN", "aws_session_token"),
    ("AWS_REGION", "aws_region"),
    ("AWS_DEFAULT_REGION", "aws_region"),
    ("AWS_ENDPOINT_URL", "aws_endpoint"),
    ("AWS_ENDPOINT", "aws_endpoint"),
    ("AWS_ALLOW_HTTP", "allow_http"),
    ("AWS_VIRTUAL_HOSTED_STYLE_REQUEST", "aws_virtual_hosted_style_request"),
    ("AWS_SKIP_SIGNATURE", "aws_skip_signature"),
    ("GOOGLE_SERVICE_ACCOUNT", "google_service_account"),
    ("GOOGLE_SERVICE_ACCOUNT_PATH", "google_service_account"),
    ("GOOGLE_SERVICE_ACCOUNT_KEY", "google_service_account_key"),
    ("GOOGLE_APPLICATION_CREDENTIALS", "google_application_credentials"),
    ("AZURE_STORAGE_ACCOUNT_NAME", "azure_storage_account_name"),
    ("AZURE_STORAGE_ACCOUNT_KEY", "azure_storage_account_key"),
    ("AZURE_STORAGE_ACCESS_KEY", "azure_storage_account_key"),
    ("AZURE_STORAGE_SAS_KEY", "azure_storage_sas_key"),
    ("AZURE_STORAGE_TOKEN", "azure_storage_token"),
    ("AZURE_STORAGE_CLIENT_ID", "azure_storage_client_id"),
    ("AZURE_CLIENT_ID", "azure_storage_client_id"),
    ("AZURE_STORAGE_CLIENT_SECRET", "azure_storage_client_secret"),
    ("AZURE_CLIENT_SECRET", "azure_storage_client_secret"),
    ("AZURE_STORAGE_TENANT_ID", "azure_storage_tenant_id"),
    ("AZURE_TENANT_ID", "azure_storage_tenant_id"),
    ("AZURE_STORAGE_ENDPOINT", "azure_storage_endpoint"),
    ("AZURE_STORAGE_USE_EMULATOR", "azure_storage_use_emulator"),
    ("AZURE_FEDERATED_TOKEN_FILE", "azure_federated_token_file"),
)

# Other spellings object_store accepts for the same setting -> the one memwal keeps.
_ALIASES: Final[Mapping[str, str]] = {
    "aws_endpoint_url": "aws_endpoint",
    "aws_allow_http": "allow_http",
    "aws_default_region": "aws_region",
    "google_service_account_path": "google_service_account",
    "azure_storage_access_key": "azure_storage_account_key",
    "azure_storage_master_key": "azure_storage_account_key",
    "azure_client_id": "azure_storage_client_id",
    "azure_client_secret": "azure_storage_client_secret",
    "azure_tenant_id": "azure_storage_tenant_id",
}

# HTTP client settings shared by every store (object_store's ClientConfigKey); obstore takes them apart
# from the store's own configuration.
CLIENT_OPTION_KEYS: Final[frozenset[str]] = frozenset(
    {
        "allow_http",
        "allow_invalid_certificates",
        "connect_timeout",
        "default_content_type",
        "http1_only",
        "http2_keep_alive_interval",
        "http2_keep_alive_timeout",
        "http2_keep_alive_while_idle",
        "http2_only",
        "pool_idle_timeout",
        "pool_max_idle_per_host",
        "proxy_url",
        "proxy_ca_certificate",
        "proxy_excludes",
        "randomize_addresses",
        "read_timeout",
        "timeout",
        "user_agent",
    }
)

# Scheme -> the key prefix of that store's own settings (object_store's spelling, which Lance uses too).
_STORE_KEY_PREFIX: Final[Mapping[str, str]] = {
    "s3": "aws_",
    "s3a": "aws_",
    "gs": "google_",
    "az": "azure_",
    "azure": "azure_",
    "abfs": "azure_",
    "abfss": "azure_",
    "adl": "azure_",
}

@dataclass(frozen=True)
class RetryPolicy:
    """Every retry of an object-store request, bounded, in one place.

    Two layers retry. Rust's ``object_store`` (inside Lance, and inside obstore, which memwal's
    own :class:`~memwal.core.io.ObjectStoreFileIO` uses) retries one HTTP request: 5xx answers
    (500 ``InternalError``, 503 ``SlowDown``) always, connection resets and timeouts only for
    requests it knows to be idempotent (GET, HEAD, LIST, plain PUT), with exponential backoff
    (0.1 s doubling to 15 s, jittered), up to ``max_retries`` times within
    ``retry_timeout_seconds``. It does not retry a conditional PUT (``If-None-Match: *``, how
    Lance commits manifests and WAL entries and memwal commits shard manifests) that was reset
    or timed out, nor a bulk delete, and it reports S3's 409 ``ConditionalRequestConflict`` as
    "already exists". memwal retries those itself, ``operation_retries`` times: its own
    conditional PUTs (an unknown outcome is settled by reading the object back), bulk deletes,
    and a writer's put, delete or flush (the writer is reopened, which replays its WAL, and the
    write repeated: upserts and deletes are idempotent). Past these bounds an operation raises
    :class:`~memwal.core.errors.StorageUnavailableError`.

    Without settings of their own, Lance would retry 3 times and obstore 10: the policy gives
    both the same numbers. Each field is set by a storage option (explicit ones win; see
    :data:`RETRY_OPTION_KEYS`), so one ``--storage-option client_max_retries=5`` changes Lance's
    and memwal's clients alike.
    """

    #: object_store: retries of one request ...
    max_retries: int = 10
    #: ... within this many seconds of its first attempt.
    retry_timeout_seconds: int = 60
    #: object_store: a request that has not completed in this long fails (and is retried if idempotent).
    request_timeout: str = "30s"
    connect_timeout: str = "5s"
    #: memwal: repeats of an operation the client did not retry (see above).
    operation_retries: int = 3
    #: memwal: the first pause between repeats, doubled each time up to ``max_backoff_seconds``.
    backoff_seconds: float = 0.2
    max_backoff_seconds: float = 5.0

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> "RetryPolicy":
        """The policy with the storage options' settings over the defaults."""
        given: dict[str, Any] = {}
        for key, (name, kind) in RETRY_OPTION_KEYS.items():
            if key in options:
                given[name] = _int_option(options, key) if kind is int else str(options[key])
        return cls(**given)

    def backoff(self, attempt: int) -> float:
        """Seconds to wait before repeat ``attempt`` (1-based) of an operation."""
        return min(self.backoff_seconds * 2 ** (attempt - 1), self.max_backoff_seconds)

    def client_options(self) -> dict[str, str]:
        """The policy as Lance storage options (object_store's spelling)."""
        return {
            "client_max_retries": str(self.max_retries),
            "client_retry_timeout": str(self.retry_timeout_seconds),
            "timeout": self.request_timeout,
            "connect_timeout": self.connect_timeout,
        }


#: Storage option -> (:class:`RetryPolicy` field, type). ``memwal_operation_retries`` is memwal's own:
#: obstore never sees it, Lance ignores it.
RETRY_OPTION_KEYS: Final[Mapping[str, tuple[str, type]]] = {
    "client_max_retries": ("max_retries", int),
    "client_retry_timeout": ("retry_timeout_seconds", int),
    "timeout": ("request_timeout", str),
    "connect_timeout": ("connect_timeout", str),
    "memwal_operation_retries": ("operation_retries", int),
}


# Parts of a key that mark its value as a secret, never shown in a repr or an error message.
_SECRET_MARKERS: Final = ("secret", "key", "token", "password", "credential", "service_account", "sas")


def canonical_key(key: str) -> str:
    """The one spelling memwal keeps for a storage option key (lower case, aliases folded)."""
    k = key.strip().lower()
    return _ALIASES.get(k, k)


def is_secret_key(key: str) -> bool:
    k = key.lower()
    return any(marker in k for marker in _SECRET_MARKERS)


def options_from_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Lance storage options taken from the standard environment variables (unset and empty ones skipped)."""
    env = os.environ if environ is None else environ
    out: dict[str, str] = {}
    for var, key in ENVIRONMENT_VARIABLES:
        value = env.get(var)
        if value and key not in out:
            out[key] = value
    return out


def parse_storage_option_args(args: Iterable[str]) -> dict[str, str]:
    """Parse repeatable ``KEY=VALUE`` strings (``--storage-option``); a later one wins for the same key.

    The value may itself contain ``=``; only the first one separates. Raises :class:`StorageOptionError`
    naming the string that has no ``=`` or an empty key.
    """
    out: dict[str, str] = {}
    for arg in args:
        key, sep, value = arg.partition("=")
        if not sep or not key.strip():
            raise StorageOptionError(f"storage option {arg!r} is not KEY=VALUE (e.g. aws_region=us-east-1)")
        out[canonical_key(key)] = value
    return out


@dataclass(frozen=True)
class StorageConfig:
    """Resolved storage options of one table, in Lance's key spelling.

    Immutable and hashable (the options are a sorted tuple of pairs), and plain data, so a table handle
    carrying it pickles to Spark executors and Spark Connect servers. Its repr names the keys but never the
    values of secrets.
    """

    items: tuple[tuple[str, str], ...] = ()

    @classmethod
    def resolve(
        cls,
        storage_options: Mapping[str, str] | None = None,
        *,
        environ: Mapping[str, str] | None = None,
    ) -> "StorageConfig":
        """Environment variables overlaid by ``storage_options`` (explicit wins, key by key).

        ``environ`` defaults to ``os.environ``; pass ``{}`` to ignore the environment.
        """
        merged = options_from_environment(environ)
        for key, value in (storage_options or {}).items():
            merged[canonical_key(key)] = str(value)
        return cls(tuple(sorted(merged.items())))

    @classmethod
    def from_args(cls, args: Iterable[str], *, environ: Mapping[str, str] | None = None) -> "StorageConfig":
        """The config for a CLI command's repeatable ``--storage-option KEY=VALUE`` flags."""
        return cls.resolve(parse_storage_option_args(args), environ=environ)

    @property
    def options(self) -> dict[str, str]:
        return dict(self.items)

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.options.get(canonical_key(key), default)

    @property
    def retry(self) -> RetryPolicy:
        """The retry bounds of this table's object-store requests (Lance's and memwal's)."""
        return RetryPolicy.from_options(self.options)

    def lance_options(self) -> dict[str, str]:
        """``storage_options=`` for every Lance call: the options, with the retry policy's
        client settings where the options do not set them (local paths ignore them). memwal's
        own settings ride along (Lance ignores keys it does not know), so code handed only
        these options still finds the policy (``RetryPolicy.from_options``)."""
        return {**self.retry.client_options(), **self.options}

    def obstore_kwargs(self, scheme: str) -> dict[str, Any]:
        """Keyword arguments for ``obstore.store.from_url`` on a ``scheme://`` URL.

        Only the settings of that scheme's store (``aws_*`` for s3, ``google_*`` for gs, ``azure_*`` for
        az/abfs) go to ``config``, because obstore rejects another store's keys; HTTP settings go to
        ``client_options``; the retry policy (:attr:`retry`) becomes obstore's ``retry_config``, and its
        timeouts ``client_options``, as for Lance. Lance-only keys that obstore has no equivalent for are
        left out.
        """
        prefix = _STORE_KEY_PREFIX.get(scheme.lower())
        options = self.lance_options()  # the retry policy's client settings included
        config = {k: v for k, v in options.items() if prefix and k.startswith(prefix)}
        client = {k: v for k, v in options.items() if k in CLIENT_OPTION_KEYS}
        kwargs: dict[str, Any] = {}
        if config:
            kwargs["config"] = config
        if client:
            kwargs["client_options"] = client
        policy = self.retry
        kwargs["retry_config"] = {
            "max_retries": policy.max_retries,
            "retry_timeout": datetime.timedelta(seconds=policy.retry_timeout_seconds),
        }
        return kwargs

    def hadoop_s3a_settings(self) -> dict[str, str]:
        """Spark settings (``spark.hadoop.fs.s3a.*``) that point Hadoop's S3A file system, which
        Spark uses for ``s3a://`` checkpoints, at the same S3 store with the same credentials.

        Path-style requests unless ``aws_virtual_hosted_style_request`` is true (object_store's
        default, and what an endpoint on an IP address needs); plain HTTP with ``allow_http``.
        """
        options = self.options
        mapping = {
            "aws_access_key_id": "fs.s3a.access.key",
            "aws_secret_access_key": "fs.s3a.secret.key",
            "aws_session_token": "fs.s3a.session.token",
            "aws_endpoint": "fs.s3a.endpoint",
            "aws_region": "fs.s3a.endpoint.region",
        }
        out = {f"spark.hadoop.{target}": options[key] for key, target in mapping.items() if options.get(key)}
        if options.get("aws_session_token"):
            out["spark.hadoop.fs.s3a.aws.credentials.provider"] = "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
        elif options.get("aws_access_key_id"):
            out["spark.hadoop.fs.s3a.aws.credentials.provider"] = "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
        virtual = options.get("aws_virtual_hosted_style_request", "false").strip().lower() in ("true", "1", "yes")
        out["spark.hadoop.fs.s3a.path.style.access"] = "false" if virtual else "true"
        if options.get("allow_http", "false").strip().lower() in ("true", "1", "yes"):
            out["spark.hadoop.fs.s3a.connection.ssl.enabled"] = "false"
        return out

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}=***" if is_secret_key(k) else f"{k}={v!r}" for k, v in self.items)
        return f"StorageConfig({shown})"


def _int_option(options: Mapping[str, str], key: str) -> int:
    try:
        return int(options[key])
    except ValueError:
        raise StorageOptionError(f"storage option {key}={options[key]!r} must be an integer") from None
