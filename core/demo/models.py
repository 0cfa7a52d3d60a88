from django.db import models


class PingRecord(models.Model):
    """One row per handled Ping: the business table that proves exactly-once.

    ``message_id`` is deliberately not unique: a duplicate must show up as a second
    row, not hide behind a constraint error.
    """

    message_id = models.CharField(max_length=200, db_index=True)
    handled_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "sluice_demo_ping"
