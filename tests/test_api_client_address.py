"""The API's throttles count the connection's own address: a client-sent X-Forwarded-For
never makes a new identity (it bypassed the wrong-token throttle: 70 guesses, each with a new
forwarded address, were 70 × 401 and no 429)."""
from __future__ import annotations

from django.test import Client, override_settings

from dashboard.security import tokens
from tests.dashboard_pages_support import make_user


@override_settings(SLUICE_API_RATE_ANON="5/min")
def test_a_forwarded_for_header_does_not_get_round_the_wrong_token_throttle(transactional_db):
    answers = [Client().get("/api/queues/", HTTP_AUTHORIZATION=f"Token guess-{i}",
                            HTTP_X_FORWARDED_FOR=f"203.0.113.{i}").status_code for i in range(8)]
    assert answers[:5] == [401] * 5
    assert answers[5:] == [429] * 3


@override_settings(SLUICE_API_RATE_USER="3/min")
def test_a_forwarded_for_header_does_not_get_round_the_per_user_throttle(transactional_db):
    _, key = tokens.issue(make_user("viewer"))
    answers = [Client().get("/api/queues/", HTTP_AUTHORIZATION=f"Token {key}",
                            HTTP_X_FORWARDED_FOR=f"198.51.100.{i}").status_code for i in range(4)]
    assert answers == [200, 200, 200, 429]
