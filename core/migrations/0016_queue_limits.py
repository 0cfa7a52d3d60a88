"""Per-queue limits across the pool (core/runtime/limits.py): the operator's override, and the
slot and ticket rows receives lock to stay within a limit."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('sluice', '0015_queue_pause'),
    ]

    operations = [
        migrations.CreateModel(
            name='QueueLimit',
            fields=[
                ('queue', models.CharField(max_length=64, primary_key=True, serialize=False)),
                ('concurrency', models.PositiveIntegerField(blank=True, null=True)),
                ('rate', models.PositiveIntegerField(blank=True, null=True)),
                ('set_at', models.DateTimeField()),
                ('set_by', models.CharField(blank=True, default='', max_length=150)),
            ],
            options={
                'db_table': 'sluice_queue_limit',
            },
        ),
        migrations.CreateModel(
            name='QueueSlot',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('queue', models.CharField(max_length=64)),
                ('slot', models.PositiveIntegerField()),
            ],
            options={
                'db_table': 'sluice_queue_slot',
                'constraints': [models.UniqueConstraint(fields=('queue', 'slot'), name='sluice_queue_slot_uniq')],
            },
        ),
        migrations.CreateModel(
            name='QueueTicket',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('queue', models.CharField(max_length=64)),
                ('ticket', models.PositiveIntegerField()),
                ('used_at', models.DateTimeField()),
            ],
            options={
                'db_table': 'sluice_queue_ticket',
                'constraints': [models.UniqueConstraint(fields=('queue', 'ticket'), name='sluice_queue_ticket_uniq')],
            },
        ),
    ]
