"""Every ``SLUICE_*`` option: its type, default and meaning, and the checks of their values.

Read through :func:`core.conf.get_settings`, never directly."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from core.conf.values import queue_limits, spark_conf

TRANSACTION_MODES = ("receive_only", "sends_atomic_with_receive", "outbox")
OUTBOX_CONCURRENCY_CONTROLS = ("optimistic", "pessimistic")
ENVIRONMENTS = ("development", "production")
LOG_FORMATS = ("text", "json")
#: SQL Server escalates a statement's row locks to a table lock at about 5,000 locks: a
#: clean-up batch stays below that so it never blocks the pumps.
MAX_OUTBOX_CLEANUP_BATCH = 4000
#: The most entries one conversation page may draw (SVG rows: beyond this a page is too tall to read).
MAX_CONVERSATION_PAGE = 2000
#: The shortest SLUICE_PEEK_DELAY: an idle pump is woken by sends (core.runtime.wakeups), so the
#: peek delay only bounds how late it sees senders that cannot wake it (SQLite and SQL
#: Server across processes); below 10 ms the polling itself becomes the load.
MIN_PEEK_DELAY = 0.01


@dataclass(frozen=True)
class SluiceSettings:
    #: Django database alias that holds the queue tables.
    DATABASE: str = "default"
    #: Schema for queue tables (PostgreSQL / SQL Server); None = the connection's default.
    SCHEMA: str | None = None
    #: This endpoint's name: the OriginatingEndpoint / ProcessingEndpoint header.
    ENDPOINT: str = "sluice"
    #: Where failed and poison messages go.
    ERROR_QUEUE: str = "error"
    #: Modules imported at start-up that register handlers with ``@handler``.
    HANDLER_MODULES: tuple[str, ...] = ("core.demo.handlers",)
    #: Extra queues ``sluice setup`` creates besides the handled ones and the error queue.
    QUEUES: tuple[str, ...] = ()
    #: Messages processed at once per queue by one worker process.
    CONCURRENCY: int = 4
    #: Limits per queue across every worker (core/runtime/limits.py): ``{"queue": {"concurrency": N,
    #: "rate": R}}``, either key optional; R is messages per second.  An operator's limits set
    #: in the database (dashboard, API, ``sluice queue limit``) win over these.
    QUEUE_LIMITS: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    #: Seconds between peeks on an empty queue that nothing woke (refused below 0.01, warned above 10).
    PEEK_DELAY: float = 1.0
    #: Most messages one peek cycle will receive before peeking again.
    MAX_RECORDS_TO_PEEK: int = 500
    #: Messages one receive statement takes, processed in one transaction in chunks (one
    #: savepoint each; core.receive.chunks).  100: the transport benchmark's best on PostgreSQL (drain 3.4x batch 8's).
    RECEIVE_BATCH_SIZE: int = 100
    #: Run the hot statements (receive, peek, insert) as server-side prepared statements
    #: where the database can (PostgreSQL: psycopg 3, on each connection).  Turn off behind
    #: PgBouncer in transaction mode, which gives a session's statements to other backends.
    PREPARED_STATEMENTS: bool = True
    #: ``sends_atomic_with_receive`` (default), ``receive_only`` or ``outbox``.
    TRANSACTION_MODE: str = "sends_atomic_with_receive"
    #: Immediate retries after the first failed attempt, before the error queue.
    IMMEDIATE_RETRIES: int = 5
    #: Largest body accepted by send, in bytes.
    MAX_BODY_BYTES: int = 4 * 1024 * 1024
    #: Rows one purge statement deletes at most.
    PURGE_BATCH_SIZE: int = 4000
    #: Seconds queue settings are cached per process (TTL ceilings, existence).
    REGISTRY_CACHE_SECONDS: float = 5.0
    #: Delayed retries after the immediate ones (SPEC C5), through the delayed store.
    DELAYED_RETRIES: int = 3
    #: Delay of the n-th delayed retry = n × this many seconds (10 s, 20 s, 30 s).
    DELAYED_RETRY_INCREASE: float = 10.0
    #: Delayed-message store table; empty = "<SLUICE_ENDPOINT>_delayed" (``sluice setup``
    #: renames a table of the old default name, "<SLUICE_ENDPOINT>.delayed").
    DELAYED_TABLE: str = ""
    #: Class implementing the delayed-message store interface (core.delayed.DelayedMessageStore).
    DELAYED_STORE: str = "core.delayed.SqlDelayedStore"
    #: Failed forwards of a due message before it goes to the error queue (0: first failure).
    DELAYED_NUMBER_OF_RETRIES: int = 0
    #: Due messages the mover moves in one transaction.
    DELAYED_BATCH_SIZE: int = 100
    #: Longest the mover sleeps when nothing is due (a store anywhere wakes it sooner).
    DELAYED_MAX_SLEEP: float = 60.0
    #: Seconds of continuous failure before the delayed store's circuit breaker triggers.
    TIME_TO_TRIGGER_STORE_BREAKER: float = 30.0
    #: Seconds of continuous failure fetching due delayed messages before its breaker triggers.
    TIME_TO_TRIGGER_FETCH_BREAKER: float = 30.0
    #: Seconds of continuous failure forwarding due delayed messages before its breaker triggers.
    TIME_TO_TRIGGER_DISPATCH_BREAKER: float = 30.0
    #: Seconds of continuous receive failure before a pump's circuit breaker triggers.
    TIME_TO_TRIGGER_RECEIVE_BREAKER: float = 30.0
    #: Forwarding failures per second above which the recovery breaker triggers.
    MAXIMUM_RECOVERY_FAILURES_PER_SECOND: float = 1.0
    #: Seconds a mover's leadership lease lasts; another worker takes over when it lapses.
    MOVER_LEASE_SECONDS: float = 10.0
    #: Seconds the PostgreSQL wake-up listener may hear nothing before it checks its
    #: connection with a query: a half-open connection would otherwise end wake-ups silently.
    WAKEUP_HEALTH_CHECK_SECONDS: float = 10.0
    #: Seconds that check may take; past it the listener reconnects (loops poll meanwhile).
    WAKEUP_HEALTH_CHECK_TIMEOUT: float = 5.0
    #: Seconds between purges of expired messages (beat's task, or `sluice worker`'s maintenance loop).
    PURGE_INTERVAL: float = 60.0
    #: Seconds between deletions of queues idle past their auto-delete time (beat, or `sluice worker`).
    IDLE_QUEUE_INTERVAL: float = 60.0
    #: Seconds between ingestions of the error queue into failed messages (beat, or `sluice worker`).
    INGEST_INTERVAL: float = 5.0
    #: Seconds between deletions of old archived failed messages (beat, or `sluice worker`).
    ARCHIVE_PURGE_INTERVAL: float = 3600.0
    #: Archived failed messages older than this many seconds are deleted (14 days).
    FAILED_ARCHIVE_RETENTION: float = 14 * 24 * 3600.0
    #: Error-queue messages ingested per transaction.
    ERROR_INGESTION_BATCH_SIZE: int = 100
    #: Failed messages a retry or archive job handles per transaction.
    RETRY_BATCH_SIZE: int = 100
    #: Longest one run of a periodic task works before leaving the rest to the next run.
    TASK_TIME_BUDGET: float = 20.0
    #: Django tasks' finished results (SUCCESSFUL or FAILED, core.tasks) older than this many
    #: seconds are deleted (7 days); results still READY are kept.
    TASK_RESULTS_RETENTION: float = 7 * 24 * 3600.0
    #: Seconds between deletions of Django tasks' results past the retention (beat, or `sluice worker`).
    TASK_RESULTS_PRUNE_INTERVAL: float = 3600.0
    #: The Celery worker hosts the pumps and the mover (bootstep); off for task-only workers.
    CELERY_HOST_LOOPS: bool = True
    #: The Celery worker also sends demo traffic (what `make run` does).
    DEMO_TRAFFIC: bool = False
    #: Send demo traffic to the ``demo`` queue from ``sluice worker --demo-traffic``: messages per second.
    DEMO_RATE: float = 2.0
    #: The outbox table; empty = ``sluice_outbox_<ENDPOINT>``.
    OUTBOX_TABLE: str = ""
    #: ``optimistic`` (insert the outbox record after the handler; the primary key stops a
    #: concurrent duplicate) or ``pessimistic`` (insert it first; its row lock makes a
    #: concurrent duplicate wait instead of running the handler too).
    OUTBOX_CONCURRENCY_CONTROL: str = "optimistic"
    #: Seconds a dispatched record is kept to recognise duplicates (7 days).
    OUTBOX_KEEP_DEDUPLICATION_DATA_FOR: float = 7 * 24 * 3600.0
    #: Seconds between clean-ups of old de-duplication data; 0 or less disables them.
    OUTBOX_CLEANUP_INTERVAL: float = 60.0
    #: Records one clean-up statement deletes at most (1–4000).
    OUTBOX_CLEANUP_BATCH_SIZE: int = MAX_OUTBOX_CLEANUP_BATCH
    #: Seconds between background dispatcher scans for records a crash left undispatched;
    #: 0 or less disables the dispatcher.
    OUTBOX_DISPATCHER_INTERVAL: float = 5.0
    #: Age in seconds before the background dispatcher takes a record over (the process
    #: that stored it normally dispatches it within milliseconds).
    OUTBOX_DISPATCHER_GRACE: float = 5.0
    #: Modules that register outbox destinations beyond queues (imported on first need).
    OUTBOX_DESTINATION_MODULES: tuple[str, ...] = ("workers.outbox",)
    #: ``development`` (default) or ``production``.  Production makes the secure web settings
    #: the defaults (HTTPS redirect, secure cookies, HSTS, the proxy's X-Forwarded-Proto;
    #: sluice/settings.py), each still overridable by its own DJANGO_* variable.
    ENV: str = "development"
    #: ``text`` (default) or ``json``: log records as one JSON object per line (Django, Celery,
    #: gunicorn), for a log shipper.
    LOG_FORMAT: str = "text"
    #: Seconds the dashboard's statistics snapshot (overview, /api/queues/, /metrics) is
    #: shared by every request before it is computed again (0: every request).
    DASHBOARD_CACHE_SECONDS: float = 3.0
    #: Past that time, show the last snapshot (up to 30 s old) while a background thread
    #: computes the next one, so no request waits for it (off: the request computes it).
    DASHBOARD_REFRESH_IN_BACKGROUND: bool = True
    #: Queues with more rows than this show max − min RowVersion (an estimate) instead of a
    #: count; expired rows are counted up to it ("at least" beyond).  (Failed messages are
    #: counted exactly by the database: see core/dialects/failed_counts_sql.py.)
    DASHBOARD_EXACT_COUNT_LIMIT: int = 1000
    #: Most body bytes one JSON API listing carries when bodies are asked for
    #: (``?bodies=1``): the page stops early rather than pass it (at least one message).
    DASHBOARD_API_BODY_BYTES: int = 8 * 1024 * 1024
    #: Seconds a dashboard query may run before the database cancels it (PostgreSQL
    #: statement_timeout, SQL Server lock timeout, SQLite a progress handler); 0: no limit.
    DASHBOARD_STATEMENT_TIMEOUT: float = 5.0
    #: Header names (case-insensitive) whose values every page, download and API response
    #: shows as "***"; the stored message keeps them for retries.
    MASK_HEADERS: tuple[str, ...] = ()
    #: Entries (attempts and failures) the conversation view draws per page, newest first;
    #: the page says how many older ones there are and links to them.
    CONVERSATION_PAGE: int = 200
    #: JSON body fields (object keys at any depth, case-insensitive) masked the same way.
    MASK_BODY_FIELDS: tuple[str, ...] = ()
    #: Record every handled message (core.records): one row per attempt, written in the
    #: pump's receive transaction, one INSERT per receive batch.
    PROCESSING_RECORDS: bool = True
    #: Where `sluice records export` writes the Parquet data set (a directory, or a URI
    #: pyarrow and Spark both write, such as s3a://bucket/records).
    RECORDS_PATH: str = "var/records"
    #: Seconds an exported record stays in the database (1 day); 0 deletes at the next run.
    RECORDS_RETENTION: float = 24 * 3600.0
    #: Where the database cannot tell which transactions are still open (SQL Server; not
    #: PostgreSQL or SQLite), seconds after which an id hole in the records is given up as
    #: rolled back: it must exceed the longest receive transaction.  Only records after a
    #: hole wait for it (core.records.horizon).
    RECORDS_EXPORT_DELAY: float = 300.0
    #: Where the Spark job writes its metric windows before they are loaded (Parquet).
    METRICS_PATH: str = "var/metrics"
    #: Seconds between pipeline runs (export + Spark job + load) on Celery beat (1 hour).
    PIPELINE_INTERVAL: float = 3600.0
    #: The Spark master of `sluice pipeline run`: local[*] (embedded, every core) or spark://HOST:7077.
    SPARK_MASTER: str = "local[*]"
    #: The embedded Spark driver's JVM heap (spark.driver.memory), e.g. 1g, 4g.
    SPARK_DRIVER_MEMORY: str = "2g"
    #: Extra Spark settings for `sluice pipeline run`'s session: a JSON object or
    #: whitespace-separated key=value pairs (e.g. spark.driver.host=10.0.0.5 for
    #: executors to reach an embedded driver, spark.hadoop.fs.s3a.* for object storage).
    SPARK_CONF: str = ""
    #: Celery beat runs the pipeline every SLUICE_PIPELINE_INTERVAL (off: run it yourself,
    #: e.g. with spark-submit on a cluster, or where no Java is installed).
    PIPELINE_SCHEDULE: bool = True
    #: Evaluate alert rules (core.alerts) in every worker's loops, one evaluator at a time (a lease).
    ALERTS_ENABLED: bool = True
    #: Seconds between evaluations of the alert rules.
    ALERTS_INTERVAL: float = 15.0
    #: Seconds the evaluator's lease lasts; another worker evaluates when it lapses.
    ALERTS_LEASE_SECONDS: float = 45.0
    #: The Sluice queue that carries alert notifications (one message per target and alert).
    ALERTS_QUEUE: str = "sluice-alerts"
    #: Seconds one delivery attempt (HTTP request or SMTP session) may take.
    ALERTS_DELIVERY_TIMEOUT: float = 10.0
    #: Attempts per notification before it counts as finally failed.
    ALERTS_DELIVERY_ATTEMPTS: int = 4
    #: Delay before retry n = base × 2^(n-1), with jitter, at most the cap (seconds); a
    #: target's Retry-After is honoured up to the cap.
    ALERTS_RETRY_BASE: float = 1.0
    #: The longest wait between two delivery attempts (seconds), Retry-After included.
    ALERTS_RETRY_CAP: float = 15.0
    #: Alert rules and targets as JSON (a file path, or the JSON text itself) that
    #: `sluice alerts import` loads: infrastructure as code.
    ALERTS_CONFIG: str = ""
    #: The dashboard's address, for links in notifications (generatorURL); "" leaves them out.
    ALERTS_DASHBOARD_URL: str = ""
    #: OpenTelemetry traces and metrics (core.tracing): ``send``/``process`` spans, W3C
    #: trace context in message headers, Sluice's meters.  Needs ``pip install 'django-sluice[otel]'``;
    #: the exporter, endpoint, service name and sampler come from the standard ``OTEL_*`` variables.
    OTEL: bool = False
    #: Seconds between two samples of every queue's length (the monitoring tab's history;
    #: one worker samples at a time, a lease).
    MONITORING_SAMPLE_INTERVAL: float = 10.0
    #: Seconds a queue-length sample is kept (2 days).
    MONITORING_SAMPLE_RETENTION: float = 2 * 24 * 3600.0
    #: Redis: worker heartbeats and breaker states, the dashboard's shared snapshot, the
    #: Celery broker.  Unset: the Django setting or environment variable ``REDIS_URL``, else
    #: ``redis://127.0.0.1:6379/0``.
    REDIS_URL: str = "redis://127.0.0.1:6379/0"
    #: Days an API token from ``sluice user token`` lives.
    API_TOKEN_DAYS: int = 90
    #: JSON API throttle for anonymous callers (and wrong tokens), per address, as a DRF
    #: rate (``30/min``, ``100/hour``).
    API_RATE_ANON: str = "30/min"
    #: JSON API throttle for logged-in callers, per user (``1200/min``).
    API_RATE_USER: str = "1200/min"
    #: Single sign-on (dashboard.security.oidc): the OpenID Connect provider's issuer URL, whose
    #: ``/.well-known/openid-configuration`` names its endpoints; empty: no single sign-on.
    OIDC_ISSUER: str = ""
    #: The dashboard's client id at that provider.
    OIDC_CLIENT_ID: str = ""
    #: The client's secret (from the environment, not a file in version control).
    OIDC_CLIENT_SECRET: str = field(default="", repr=False)
    #: Scopes asked for (space-separated); some providers need ``groups`` added for the role claim.
    OIDC_SCOPES: str = "openid email profile"
    #: The claim that names the user (falls back to ``sub``).
    OIDC_USERNAME_CLAIM: str = "preferred_username"
    #: The claim (a list or one string; a dotted path reaches into objects, realm_access.roles)
    #: whose values give the role, through the three lists below; the highest role wins.
    OIDC_ROLE_CLAIM: str = "groups"
    #: Claim values that make a viewer.
    OIDC_VIEWER_GROUPS: tuple[str, ...] = ("sluice-viewer",)
    #: Claim values that make an operator.
    OIDC_OPERATOR_GROUPS: tuple[str, ...] = ("sluice-operator",)
    #: Admins are operators who may also use Django's admin site (staff and superuser).
    OIDC_ADMIN_GROUPS: tuple[str, ...] = ("sluice-admin",)
    #: The login page's button: "Log in with <this>".
    OIDC_PROVIDER_NAME: str = "single sign-on"
    #: Log in with a user name and password (the login form); off, only single sign-on.
    LOCAL_LOGIN: bool = True
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.ENV not in ENVIRONMENTS:
            raise ValueError(f"SLUICE_ENV must be one of {', '.join(ENVIRONMENTS)}, not {self.ENV!r}")
        if self.LOG_FORMAT not in LOG_FORMATS:
            raise ValueError(f"SLUICE_LOG_FORMAT must be one of {', '.join(LOG_FORMATS)}, not {self.LOG_FORMAT!r}")
        if self.TRANSACTION_MODE not in TRANSACTION_MODES:
            raise ValueError(
                f"SLUICE_TRANSACTION_MODE must be one of {', '.join(TRANSACTION_MODES)}, "
                f"not {self.TRANSACTION_MODE!r}"
            )
        if self.PEEK_DELAY < MIN_PEEK_DELAY:
            raise ValueError(f"SLUICE_PEEK_DELAY below {MIN_PEEK_DELAY * 1000:.0f} ms would hammer the database; refused")
        for name in ("CONCURRENCY", "MAX_RECORDS_TO_PEEK", "RECEIVE_BATCH_SIZE", "PURGE_BATCH_SIZE", "MAX_BODY_BYTES"):
            if getattr(self, name) < 1:
                raise ValueError(f"SLUICE_{name} must be at least 1")
        for name in ("IMMEDIATE_RETRIES", "DELAYED_RETRIES", "DELAYED_NUMBER_OF_RETRIES"):
            if getattr(self, name) < 0:
                raise ValueError(f"SLUICE_{name} must be 0 or more")
        for name in ("DELAYED_BATCH_SIZE",):
            if getattr(self, name) < 1:
                raise ValueError(f"SLUICE_{name} must be at least 1")
        for name in ("DELAYED_MAX_SLEEP", "MOVER_LEASE_SECONDS", "MAXIMUM_RECOVERY_FAILURES_PER_SECOND",
                     "WAKEUP_HEALTH_CHECK_SECONDS", "WAKEUP_HEALTH_CHECK_TIMEOUT",
                     "TIME_TO_TRIGGER_STORE_BREAKER", "TIME_TO_TRIGGER_FETCH_BREAKER",
                     "TIME_TO_TRIGGER_DISPATCH_BREAKER", "TIME_TO_TRIGGER_RECEIVE_BREAKER"):
            if getattr(self, name) <= 0:
                raise ValueError(f"SLUICE_{name} must be positive")
        if self.OUTBOX_CONCURRENCY_CONTROL not in OUTBOX_CONCURRENCY_CONTROLS:
            raise ValueError(
                f"SLUICE_OUTBOX_CONCURRENCY_CONTROL must be one of {', '.join(OUTBOX_CONCURRENCY_CONTROLS)}, "
                f"not {self.OUTBOX_CONCURRENCY_CONTROL!r}"
            )
        if not 1 <= self.OUTBOX_CLEANUP_BATCH_SIZE <= MAX_OUTBOX_CLEANUP_BATCH:
            raise ValueError(f"SLUICE_OUTBOX_CLEANUP_BATCH_SIZE must be 1–{MAX_OUTBOX_CLEANUP_BATCH}")
        if self.DASHBOARD_API_BODY_BYTES < 1 or self.DASHBOARD_STATEMENT_TIMEOUT < 0:
            raise ValueError("SLUICE_DASHBOARD_API_BODY_BYTES must be at least 1 and "
                             "SLUICE_DASHBOARD_STATEMENT_TIMEOUT must not be negative")
        if not 1 <= self.CONVERSATION_PAGE <= MAX_CONVERSATION_PAGE:
            raise ValueError(f"SLUICE_CONVERSATION_PAGE must be 1–{MAX_CONVERSATION_PAGE}")
        if self.DASHBOARD_CACHE_SECONDS < 0 or self.DASHBOARD_EXACT_COUNT_LIMIT < 1:
            raise ValueError("SLUICE_DASHBOARD_CACHE_SECONDS must not be negative and "
                             "SLUICE_DASHBOARD_EXACT_COUNT_LIMIT must be at least 1")
        if self.OUTBOX_KEEP_DEDUPLICATION_DATA_FOR < 0 or self.OUTBOX_DISPATCHER_GRACE < 0:
            raise ValueError("SLUICE_OUTBOX_KEEP_DEDUPLICATION_DATA_FOR and SLUICE_OUTBOX_DISPATCHER_GRACE "
                             "must not be negative")

        if self.TASK_RESULTS_RETENTION < 0 or self.TASK_RESULTS_PRUNE_INTERVAL <= 0:
            raise ValueError("SLUICE_TASK_RESULTS_RETENTION must not be negative and "
                             "SLUICE_TASK_RESULTS_PRUNE_INTERVAL must be positive")
        if self.RECORDS_RETENTION < 0 or self.RECORDS_EXPORT_DELAY < 0:
            raise ValueError("SLUICE_RECORDS_RETENTION and SLUICE_RECORDS_EXPORT_DELAY must not be negative")
        if self.PIPELINE_INTERVAL <= 0:
            raise ValueError("SLUICE_PIPELINE_INTERVAL must be positive")
        for name in ("RECORDS_PATH", "METRICS_PATH", "SPARK_MASTER"):
            if not str(getattr(self, name)).strip():
                raise ValueError(f"SLUICE_{name} must not be empty")
        queue_limits(self.QUEUE_LIMITS)
        try:
            spark_conf(self.SPARK_CONF)
        except ValueError as exc:
            raise ValueError(f"SLUICE_SPARK_CONF: {exc}") from None
        for name in ("ALERTS_INTERVAL", "ALERTS_LEASE_SECONDS", "ALERTS_DELIVERY_TIMEOUT", "ALERTS_RETRY_BASE",
                     "ALERTS_RETRY_CAP"):
            if getattr(self, name) <= 0:
                raise ValueError(f"SLUICE_{name} must be positive")
        if self.MONITORING_SAMPLE_INTERVAL <= 0 or self.MONITORING_SAMPLE_RETENTION <= 0:
            raise ValueError("SLUICE_MONITORING_SAMPLE_INTERVAL and SLUICE_MONITORING_SAMPLE_RETENTION must be positive")
        if self.ALERTS_DELIVERY_ATTEMPTS < 1:
            raise ValueError("SLUICE_ALERTS_DELIVERY_ATTEMPTS must be at least 1")
        for name in ("API_RATE_ANON", "API_RATE_USER"):
            if not re.fullmatch(r"\d+/(s|sec|second|m|min|minute|h|hour|d|day)", getattr(self, name).strip()):
                raise ValueError(f"SLUICE_{name} must be a rate such as 30/min or 1200/hour, not {getattr(self, name)!r}")
        if self.API_TOKEN_DAYS < 1:
            raise ValueError("SLUICE_API_TOKEN_DAYS must be at least 1")
        if not re.fullmatch(r"\d+[kKmMgGtT]?", self.SPARK_DRIVER_MEMORY.strip()):
            raise ValueError(f"SLUICE_SPARK_DRIVER_MEMORY must be a JVM size such as 2g, "
                             f"not {self.SPARK_DRIVER_MEMORY!r}")

        if self.OIDC_ISSUER and not re.fullmatch(r"https?://[^\s/?#]+(/[^\s?#]*)?", self.OIDC_ISSUER):
            raise ValueError(f"SLUICE_OIDC_ISSUER must be the provider's http(s) URL, not {self.OIDC_ISSUER!r}")
        if not self.OIDC_ROLE_CLAIM.strip() or not self.OIDC_USERNAME_CLAIM.strip():
            raise ValueError("SLUICE_OIDC_ROLE_CLAIM and SLUICE_OIDC_USERNAME_CLAIM must not be empty")

    @property
    def delayed_table(self) -> str:
        return self.DELAYED_TABLE or f"{self.ENDPOINT}_delayed"

    @property
    def outbox_table(self) -> str:
        return self.OUTBOX_TABLE or f"sluice_outbox_{self.ENDPOINT}"
