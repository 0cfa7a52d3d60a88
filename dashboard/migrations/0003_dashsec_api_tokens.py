"""API tokens hashed at rest (dashboard/security/tokens.py).  Keys of DRF's plain-text token table
(``authtoken_token``, from before) are carried over as hashes, valid SLUICE_API_TOKEN_DAYS
from now, and wiped from the old table."""
import datetime as dt
import hashlib

import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.db import migrations, models


OLD_TABLE = "authtoken_token"


def carry_over_plain_tokens(apps, schema_editor):
    connection = schema_editor.connection
    if OLD_TABLE not in connection.introspection.table_names():
        return
    ApiToken = apps.get_model("dashboard", "ApiToken")
    expires = django.utils.timezone.now() + dt.timedelta(days=getattr(settings, "SLUICE_API_TOKEN_DAYS", 90))
    quoted = connection.ops.quote_name(OLD_TABLE)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {connection.ops.quote_name('key')}, user_id FROM {quoted}")
        rows = cursor.fetchall()
        ApiToken.objects.using(connection.alias).bulk_create(
            ApiToken(user_id=user_id, digest=hashlib.sha256(key.encode("utf-8")).hexdigest(), prefix=key[:8],
                     expires=expires) for key, user_id in rows)
        cursor.execute(f"DELETE FROM {quoted}")


class Migration(migrations.Migration):

    dependencies = [
        ('dashboard', '0002_roles'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='ApiToken',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('digest', models.CharField(max_length=64, unique=True)),
                ('prefix', models.CharField(max_length=8)),
                ('created', models.DateTimeField(default=django.utils.timezone.now)),
                ('expires', models.DateTimeField()),
                ('revoked_at', models.DateTimeField(blank=True, null=True)),
                ('user', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='sluice_api_tokens', to=settings.AUTH_USER_MODEL)),
            ],
            options={
                'db_table': 'sluice_api_token',
                'ordering': ['-created'],
            },
        ),
        migrations.RunPython(carry_over_plain_tokens, migrations.RunPython.noop),
    ]
