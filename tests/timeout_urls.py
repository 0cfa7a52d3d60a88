"""A URLconf for tests/test_dashboard_limits.py: the dashboard's routes plus one view whose
query runs for seconds (a real slow statement on the test database), under /slow/ and
/api/slow/, to see SLUICE_DASHBOARD_STATEMENT_TIMEOUT stop it."""
from django.db import connection
from django.http import HttpResponse
from django.urls import include, path

#: A statement that runs for seconds: PostgreSQL sleeps, SQLite counts to 50 million.
SLOW = {"postgresql": "SELECT pg_sleep(3)",
        "sqlite": "WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c WHERE n < 50000000) "
                  "SELECT COUNT(*) FROM c"}


def slow(request):
    with connection.cursor() as cursor:
        cursor.execute(SLOW[connection.vendor])
        cursor.fetchall()
    return HttpResponse("finished")


urlpatterns = [
    path("slow/", slow),
    path("api/slow/", slow),
    path("", include("sluice.urls")),
]
