"""Paused queues (core/runtime/pauses.py): one row per paused queue; and the `queue_paused` alert rule kind."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('sluice', '0014_task_finished_partial_index'),
    ]

    operations = [
        migrations.CreateModel(
            name='QueuePause',
            fields=[
                ('queue', models.CharField(max_length=64, primary_key=True, serialize=False)),
                ('paused_at', models.DateTimeField()),
                ('paused_by', models.CharField(blank=True, default='', max_length=150)),
            ],
            options={
                'db_table': 'sluice_queue_pause',
            },
        ),
        migrations.AlterField(
            model_name='alertrule',
            name='kind',
            field=models.CharField(choices=[('failed_group', 'failed-message group appears or grows by N in T'), ('breaker_open', 'circuit breaker open'), ('heartbeat_lost', 'worker heartbeat stopped'), ('queue_length', 'queue length above N'), ('oldest_age', 'oldest message older than T seconds'), ('critical_time', 'critical time (sent to handled) p95 above T seconds'), ('stalled_queue', 'messages waiting, no completions for T'), ('outbox_backlog', 'outbox backlog above N'), ('outbox_age', 'oldest undispatched outbox record older than T seconds'), ('delayed_not_moved', 'delayed messages due but not moved for T seconds'), ('redis_down', 'Redis unreachable from the evaluating worker'), ('database_down', 'the database unreachable from a worker (its database breakers)'), ('workers_below', 'fewer than N live workers (none at all included)'), ('records_not_exported', 'processing records not exported for T seconds'), ('delivery_failed', 'an alert notification finally failed'), ('queue_paused', 'a queue paused for longer than T seconds')], max_length=32),
        ),
    ]
