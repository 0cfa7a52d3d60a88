"""Single sign-on (OpenID Connect) against a real provider on 127.0.0.1 (tests/oidc_provider.py),
with Django's test client standing in for the browser: the dashboard sends it to the provider,
the provider sends it back with a code, the dashboard exchanges the code, checks the ID token
(RS256 from the provider's JWKS, issuer, audience, nonce; PKCE) and reads the role from the
groups claim.  The whole login in Chromium: tests/test_browser_sso.py."""
from __future__ import annotations

import re
import socket
import urllib.parse

import pytest
import requests
from django.contrib.auth import authenticate
from django.contrib.auth.models import User
from django.test import Client, RequestFactory

from core.conf import SluiceSettings
from core.transport import Transport
from dashboard.checks import sluice_project
from dashboard.security.oidc import forget_provider, role_from_claims
from dashboard.security.permissions import role_of
from tests.conftest import ROOT
from tests.dashboard_pages_support import PASSWORD, _fresh_dashboard_cache, make_user  # noqa: F401
from tests.oidc_provider import CLIENT_ID, CLIENT_SECRET, OIDCProvider, provider  # noqa: F401 — a fixture

pytestmark = pytest.mark.django_db(transaction=True)


def sso_login(client: Client, provider: OIDCProvider, prefix: str = "", next_path: str = ""):
    """The browser's round trip: to the provider, back with a code; the callback's answer."""
    start = client.get(f"{prefix}/accounts/sso/login/" + (f"?next={urllib.parse.quote(next_path)}" if next_path else ""))
    assert start.status_code == 302 and start["Location"].startswith(f"{provider.issuer}/authorize?"), start
    at_provider = requests.get(start["Location"], allow_redirects=False, timeout=10)
    assert at_provider.status_code == 302
    back = urllib.parse.urlsplit(at_provider.headers["Location"])
    return client.get(f"{back.path}?{back.query}")


def test_an_operator_logs_in_with_single_sign_on_and_acts(provider, queue):
    provider.log_in_as("olga", groups=["staff", "sluice-operator"])
    client = Client()
    landed = sso_login(client, provider)
    assert landed.status_code == 302 and landed["Location"] == "/"
    assert provider.seen == ["GET /.well-known/openid-configuration", "GET /authorize", "POST /token",
                             "GET /jwks", "GET /userinfo"]
    user = User.objects.get(username="olga")
    assert role_of(user) == "operator" and not user.has_usable_password() and user.email == "olga@example.com"
    assert not user.is_staff
    page = client.get("/")
    assert page.status_code == 200 and b"olga" in page.content and b">operator<" in page.content
    Transport().send_many(queue, ["a", "b"])
    deleted = client.post(f"/queues/{queue}/delete/", {"ids": [m.id for m in Transport().browse(queue)]})
    assert deleted.status_code == 303
    assert Transport().browse(queue) == []


def test_a_viewer_only_views(provider, queue):
    provider.log_in_as("vic", groups="sluice-viewer")  # one string, not a list: also read
    client = Client()
    sso_login(client, provider)
    assert client.get("/").status_code == 200
    assert client.get(f"/queues/{queue}/").status_code == 200
    Transport().send(queue, "keep")
    refused = client.post(f"/queues/{queue}/delete/", {"ids": [m.id for m in Transport().browse(queue)]})
    assert refused.status_code == 403 and b"Only operators" in refused.content
    assert len(Transport().browse(queue)) == 1


def test_groups_that_grant_nothing_get_403_pages_not_a_login_loop(provider):
    provider.log_in_as("nina", groups=["marketing"])
    client = Client()
    landed = sso_login(client, provider, next_path="/failed/")
    assert landed.status_code == 302 and landed["Location"] == "/failed/"  # logged in: the provider said yes
    for path in ("/", "/failed/", "/api/queues/"):
        answer = client.get(path)
        assert answer.status_code == 403, path  # not a redirect to a login the user already passed
    page = client.get("/").content.decode()
    assert "no Sluice role" in page and "Log out" in page
    assert role_of(User.objects.get(username="nina")) is None


def test_the_role_follows_the_provider_at_every_login(provider):
    provider.log_in_as("ada", groups=["sluice-admin"])
    sso_login(Client(), provider)
    ada = User.objects.get(username="ada")
    assert role_of(ada) == "operator" and ada.is_staff and ada.is_superuser  # admin: the Django admin too
    provider.log_in_as("ada", groups=["sluice-viewer"])  # demoted at the provider
    sso_login(Client(), provider)
    ada = User.objects.get(username="ada")
    assert role_of(ada) == "viewer" and not ada.is_staff and not ada.is_superuser


@pytest.mark.parametrize("claims, role", [
    ({"groups": ["sluice-viewer", "sluice-operator"]}, "operator"),  # the highest wins
    ({"groups": ["ops"]}, "operator"),  # through SLUICE_OIDC_OPERATOR_GROUPS
    ({"realm_access": {"roles": ["sluice-admin"]}}, None),  # another claim than the one named
    ({"groups": 7}, None),
    ({}, None),
])
def test_role_mapping(settings, claims, role):
    settings.SLUICE_OIDC_OPERATOR_GROUPS = ["sluice-operator", "ops"]
    assert role_from_claims(claims) == role


def test_a_dotted_role_claim_reaches_into_objects(settings):
    settings.SLUICE_OIDC_ROLE_CLAIM = "realm_access.roles"
    assert role_from_claims({"realm_access": {"roles": ["sluice-admin"]}}) == "admin"


def test_local_login_switched_off_hides_the_form_and_refuses_passwords(provider, settings):
    make_user("operator", name="local-olive")
    settings.SLUICE_LOCAL_LOGIN = False
    page = Client().get("/accounts/login/").content.decode()
    assert 'name="password"' not in page and "Log in with single sign-on" in page
    client = Client()
    refused = client.post("/accounts/login/", {"username": "local-olive", "password": PASSWORD})
    assert refused.status_code == 403 and "switched off" in refused.content.decode()
    assert client.get("/").status_code == 302  # still anonymous: to the login page
    # The password backend itself refuses (the admin site's login too).
    assert authenticate(RequestFactory().post("/admin/login/"), username="local-olive", password=PASSWORD) is None
    settings.SLUICE_LOCAL_LOGIN = True
    assert authenticate(RequestFactory().post("/admin/login/"), username="local-olive", password=PASSWORD)


def test_both_ways_in_by_default(provider):
    page = Client().get("/accounts/login/?next=/failed/").content.decode()
    assert 'name="password"' in page
    assert 'href="/accounts/sso/login/?next=/failed/"' in page


def test_a_local_account_is_not_taken_over(provider):
    make_user("operator", name="root-like")
    provider.log_in_as("root-like", groups=["sluice-admin"])
    client = Client()
    landed = sso_login(client, provider)
    assert landed.status_code == 302 and landed["Location"] == "/accounts/login/?sso=failed"
    assert client.get("/").status_code == 302  # not logged in
    assert not User.objects.get(username="root-like").is_superuser
    assert "did not log you in" in client.get(landed["Location"]).content.decode()


def test_an_id_token_for_another_client_is_refused(provider):
    provider.log_in_as("eve", groups=["sluice-operator"])
    provider.audience = "some-other-app"
    client = Client()
    landed = sso_login(client, provider)
    assert landed["Location"] == "/accounts/login/?sso=failed"
    assert client.get("/").status_code == 302 and not User.objects.filter(username="eve").exists()


def test_the_user_refusing_at_the_provider_lands_on_the_login_page(provider):
    provider.user = None
    client = Client()
    landed = sso_login(client, provider)
    assert landed["Location"] == "/accounts/login/?sso=failed"


def test_a_provider_that_does_not_answer_is_said_so(settings):
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    settings.SLUICE_OIDC_ISSUER = f"http://127.0.0.1:{port}"
    settings.SLUICE_OIDC_CLIENT_ID, settings.SLUICE_OIDC_CLIENT_SECRET = CLIENT_ID, CLIENT_SECRET
    forget_provider()
    client = Client()
    start = client.get("/accounts/sso/login/")
    assert start.status_code == 302 and start["Location"] == "/accounts/login/?sso=unavailable"
    assert "does not answer" in client.get(start["Location"]).content.decode()


def test_without_an_issuer_there_is_no_single_sign_on():
    assert Client().get("/accounts/sso/login/").status_code == 404
    assert Client().get("/accounts/sso/callback/?code=x&state=y").status_code == 404
    assert "single sign-on" not in Client().get("/accounts/login/").content.decode()


@pytest.mark.urls("tests.prefix_urls")
def test_in_a_host_project_under_a_prefix(provider):
    provider.log_in_as("hank", groups=["sluice-viewer"])
    client = Client()
    start = client.get("/ops/accounts/sso/login/")
    redirect_uri = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(start["Location"]).query))["redirect_uri"]
    assert redirect_uri == "http://testserver/ops/accounts/sso/callback/"
    landed = sso_login(client, provider, prefix="/ops")
    assert landed["Location"] == "/ops/"
    assert client.get("/ops/").status_code == 200


def test_half_configured_single_sign_on_is_a_check_error(settings):
    def errors() -> list[str]:
        return [f"{m.id}: {m.msg}" for m in sluice_project() if m.id == "sluice.E014"]

    assert errors() == []
    settings.SLUICE_OIDC_ISSUER = "https://login.example.com/realms/ops"
    assert errors() == ["sluice.E014: single sign-on is half configured: SLUICE_OIDC_CLIENT_ID, "
                        "SLUICE_OIDC_CLIENT_SECRET unset"]
    settings.SLUICE_OIDC_CLIENT_ID, settings.SLUICE_OIDC_CLIENT_SECRET = "sluice", "s3cret"
    assert errors() == []
    settings.AUTHENTICATION_BACKENDS = ["django.contrib.auth.backends.ModelBackend"]
    assert errors() == ["sluice.E014: SLUICE_OIDC_ISSUER is set but no backend logs its users in"]
    settings.SLUICE_OIDC_ISSUER = settings.SLUICE_OIDC_CLIENT_ID = settings.SLUICE_OIDC_CLIENT_SECRET = ""
    settings.SLUICE_LOCAL_LOGIN = False
    assert errors() == ["sluice.E014: SLUICE_LOCAL_LOGIN is off and no single sign-on is configured: "
                        "nobody can log in"]


def test_a_bad_issuer_is_refused_naming_the_setting():
    with pytest.raises(ValueError, match="SLUICE_OIDC_ISSUER must be the provider's http"):
        SluiceSettings(OIDC_ISSUER="login.example.com")
    with pytest.raises(ValueError, match="SLUICE_OIDC_ROLE_CLAIM"):
        SluiceSettings(OIDC_ROLE_CLAIM=" ")
    assert "s3cret" not in repr(SluiceSettings(OIDC_CLIENT_SECRET="s3cret"))


# -- the docs' settings, run as written ----------------------------------------------------------

def titled_block(page: str, title: str) -> str:
    text = (ROOT / "docs" / page).read_text()
    return dict(re.findall(r'```\w+ title="([^"]+)"\n(.*?)```', text, re.S))[title]


def use_settings_block(page: str, title: str, provider: OIDCProvider, monkeypatch, settings) -> None:
    """Run the page's block and make its settings the project's, with the example issuer and
    secret swapped for the test provider's; the system checks find nothing missing."""
    monkeypatch.setenv("SLUICE_OIDC_CLIENT_SECRET", CLIENT_SECRET)
    namespace: dict = {}
    exec(titled_block(page, title), namespace)
    assert namespace["SLUICE_OIDC_ISSUER"].startswith("https://")  # the page shows a real-looking one
    written = {name: value for name, value in namespace.items() if name.isupper()}
    written.update(SLUICE_OIDC_ISSUER=provider.issuer, SLUICE_OIDC_CLIENT_ID=CLIENT_ID,
                   SLUICE_OIDC_CLIENT_SECRET=CLIENT_SECRET)
    for name, value in written.items():
        setattr(settings, name, value)
    assert [m.id for m in sluice_project() if m.id == "sluice.E014"] == []


def test_the_single_sign_on_page_settings_work_as_written(provider, monkeypatch, settings):
    use_settings_block("operations/single-sign-on.md", "settings.py (single sign-on)", provider, monkeypatch, settings)
    page = Client().get("/accounts/login/").content.decode()
    assert "Log in with Example ID" in page and 'name="password"' not in page
    for user, groups, role in (("sam", ["sre"], "operator"), ("eli", ["engineering"], "viewer"),
                               ("pat", ["platform-admins"], "operator")):
        provider.log_in_as(user, groups=groups)
        sso_login(Client(), provider)
        assert role_of(User.objects.get(username=user)) == role
    assert User.objects.get(username="pat").is_superuser


@pytest.mark.urls("tests.prefix_urls")
def test_the_own_project_page_settings_work_as_written(provider, monkeypatch, settings):
    use_settings_block("django-project.md", "mysite/settings.py (single sign-on)", provider, monkeypatch, settings)
    provider.log_in_as("hope", groups=["sluice-operator"])
    client = Client()
    assert sso_login(client, provider, prefix="/ops")["Location"] == "/ops/"
    assert b">operator<" in client.get("/ops/").content
