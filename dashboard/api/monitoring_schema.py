"""The monitoring tab's JSON shapes (``/api/monitoring/``): periods, buckets, queues, workers,
deploy markers and slices, as drf-spectacular documents them in the OpenAPI schema."""
from rest_framework import serializers as f


class Percentiles(f.Serializer):
    p50 = f.FloatField(allow_null=True)
    p95 = f.FloatField(allow_null=True)
    p99 = f.FloatField(allow_null=True)


class MonitoringPeriod(f.Serializer):
    name = f.CharField(help_text="1m, 5m, 15m, 1h or range.")
    start = f.DateTimeField()
    end = f.DateTimeField()
    bucket_seconds = f.IntegerField()
    live = f.BooleanField(help_text="The period ends now.")
    refresh_seconds = f.IntegerField(allow_null=True, help_text="How often the page refreshes (null: a past range).")
    now = f.DateTimeField(help_text="The database's clock.")
    note = f.CharField(allow_blank=True, help_text="How a requested range was made to fit (swapped, cut to now "
                                                   "or to 31 days); empty when taken as asked.")


class MonitoringBucket(f.Serializer):
    start = f.DateTimeField()
    records = f.IntegerField()
    retried = f.IntegerField()
    failures = f.IntegerField()
    throughput_per_s = f.FloatField(allow_null=True)
    length = f.IntegerField(allow_null=True)
    processing_avg_ms = f.FloatField(allow_null=True)
    critical_avg_ms = f.FloatField(allow_null=True)
    processing_ms = Percentiles()
    critical_ms = Percentiles()
    from_windows = f.BooleanField(help_text="From the pipeline's metric windows (older than the records kept).")


class MonitoringQueue(f.Serializer):
    queue = f.CharField()
    kind = f.CharField(required=False)
    failed_unresolved = f.IntegerField()
    records = f.IntegerField()
    retried = f.IntegerField()
    failures = f.IntegerField()
    throughput_per_s = f.FloatField()
    processing_avg_ms = f.FloatField(allow_null=True, help_text="Over every record of the period.")
    critical_avg_ms = f.FloatField(allow_null=True, help_text="Over every processed record (skewed ones left out).")
    processing_ms = Percentiles(help_text="From the newest records (one queue's answer; null in the overview), "
                                          "or the pipeline's windows.")
    critical_ms = Percentiles()
    sampled = f.IntegerField(help_text="Records the percentiles come from (the newest of the period; 0: none read).")
    skewed = f.IntegerField(help_text="Records that ended before they were sent or due (clock skew).")
    length = f.IntegerField(allow_null=True)
    length_average = f.FloatField(allow_null=True)
    length_estimated = f.BooleanField()
    buckets = MonitoringBucket(many=True)


class MonitoringWorker(f.Serializer):
    name = f.CharField()
    last_seen = f.DateTimeField(allow_null=True)
    age_seconds = f.FloatField(allow_null=True)
    stale = f.BooleanField()
    clock_skew = f.CharField(allow_blank=True)
    dead_loops = f.ListField(child=f.CharField())


class MonitoringWorkers(f.Serializer):
    redis = f.CharField()
    error = f.CharField(allow_blank=True)
    workers = MonitoringWorker(many=True)


class DeployMarker(f.Serializer):
    id = f.IntegerField()
    at = f.DateTimeField()
    label = f.CharField()
    by = f.CharField(allow_blank=True)


class MonitoringOverview(f.Serializer):
    period = MonitoringPeriod()
    hidden = f.IntegerField(help_text="Queues left out (beyond 50, or not matching q).")
    queues = MonitoringQueue(many=True)
    workers = MonitoringWorkers()
    deploys = DeployMarker(many=True)


class MonitoringSlice(f.Serializer):
    key = f.CharField(allow_blank=True)
    records = f.IntegerField()
    retried = f.IntegerField()
    failures = f.IntegerField()
    throughput_per_s = f.FloatField()
    skewed = f.IntegerField()
    processing_ms = Percentiles()
    critical_ms = Percentiles()


class MonitoringQueueDetail(f.Serializer):
    period = MonitoringPeriod()
    queue = MonitoringQueue()
    message_types = MonitoringSlice(many=True)
    workers = MonitoringSlice(many=True)
    deploys = DeployMarker(many=True)
