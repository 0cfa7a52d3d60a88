"""Processing records keep NServiceBus.DeliverAt (critical time as NServiceBus defines it);
the export watermark keeps its horizon (no committed record is passed over) and the
earliest record whose windows are not loaded yet (a failed run leaves no hole)."""
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('sluice', '0006_failq_failure_key'),
    ]

    operations = [
        migrations.AddField(
            model_name='processingrecord',
            name='deliver_at_us',
            field=models.BigIntegerField(null=True),
        ),
        migrations.AddField(
            model_name='exportwatermark',
            name='horizon_id',
            field=models.BigIntegerField(null=True),
        ),
        migrations.AddField(
            model_name='exportwatermark',
            name='horizon_token',
            field=models.TextField(default=''),
        ),
        migrations.AddField(
            model_name='exportwatermark',
            name='horizon_us',
            field=models.BigIntegerField(null=True),
        ),
        migrations.AddField(
            model_name='exportwatermark',
            name='pending_since_us',
            field=models.BigIntegerField(null=True),
        ),
    ]
