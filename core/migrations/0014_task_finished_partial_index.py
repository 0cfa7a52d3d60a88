"""Two index entries fewer per enqueued task: the retention's index on ``finished_at`` only
holds finished results (a READY row has none), and PostgreSQL loses the
``varchar_pattern_ops`` twin Django adds to a character key (for LIKE, which no one runs on
result ids)."""
from django.db import migrations, models


def _like_twin(schema_editor, model):
    """The twin's CREATE statement and name, where the schema editor makes one (PostgreSQL's)."""
    make = getattr(schema_editor, "_create_like_index_sql", None)
    if make is None:
        return None, None
    pk = model._meta.pk
    return make(model, pk), schema_editor._create_index_name(model._meta.db_table, [pk.column], suffix="_like")


def drop_like_twin(apps, schema_editor):
    model = apps.get_model("sluice", "TaskResultRecord")
    statement, name = _like_twin(schema_editor, model)
    if statement is not None:
        schema_editor.execute(schema_editor._delete_index_sql(model, name))


def create_like_twin(apps, schema_editor):
    model = apps.get_model("sluice", "TaskResultRecord")
    statement, _ = _like_twin(schema_editor, model)
    if statement is not None:
        schema_editor.execute(statement)


class Migration(migrations.Migration):

    dependencies = [
        ("sluice", "0013_task_results"),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name="taskresultrecord",
            name="sluice_task_finished",
        ),
        migrations.AddIndex(
            model_name="taskresultrecord",
            index=models.Index(condition=models.Q(("finished_at__isnull", False)), fields=["finished_at"],
                               name="sluice_task_finished"),
        ),
        migrations.RunPython(drop_like_twin, create_like_twin, elidable=False),
    ]
