"""Log in and out: Django's own views with the dashboard's template, and single sign-on
(OpenID Connect, dashboard.security.oidc) beside the password form or instead of it
(``SLUICE_LOCAL_LOGIN``)."""
from __future__ import annotations

import logging
from typing import Any

import requests
from django.contrib.auth import views as auth_views
from django.core.exceptions import SuspiciousOperation
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.views.generic import View
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView

from core.conf import get_settings
from dashboard.security.oidc import ProviderUnavailable, oidc_setting, provider, sso_enabled

log = logging.getLogger("sluice.dashboard.sso")


class LoginView(auth_views.LoginView):
    """The password form (unless switched off) and the single sign-on button (when set up)."""

    template_name = "dashboard/login.html"
    redirect_authenticated_user = False
    next_page = "dashboard:overview"

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        options = get_settings()
        return {**super().get_context_data(**kwargs), "local_login": options.LOCAL_LOGIN, "sso": sso_enabled(),
                "sso_name": options.OIDC_PROVIDER_NAME, "sso_problem": self.request.GET.get("sso", "")}

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not get_settings().LOCAL_LOGIN:  # the form is hidden; a hand-made POST is refused too
            return self.render_to_response(self.get_context_data(refused=True), status=403)
        return super().post(request, *args, **kwargs)


login = LoginView.as_view()
logout = auth_views.LogoutView.as_view(next_page="dashboard:login")


def _unavailable(exc: Exception) -> HttpResponseRedirect:
    log.warning("single sign-on: the identity provider does not answer: %s", exc)
    return HttpResponseRedirect(reverse("dashboard:login") + "?sso=unavailable")


class SSOLoginView(OIDCAuthenticationRequestView):
    """To the provider's authorization endpoint (state, nonce and PKCE in the session)."""

    get_settings = staticmethod(oidc_setting)

    def __init__(self, **kwargs: Any) -> None:
        # The library asks for the endpoints here; get() does, where a provider that does not
        # answer can be told to the user instead of becoming a 500.
        View.__init__(self, **kwargs)

    def get(self, request: HttpRequest) -> HttpResponse:
        if not sso_enabled():
            raise Http404("single sign-on is not configured")
        try:
            self.OIDC_OP_AUTH_ENDPOINT = provider().authorization_endpoint
        except ProviderUnavailable as exc:
            return _unavailable(exc)
        self.OIDC_RP_CLIENT_ID = get_settings().OIDC_CLIENT_ID
        return super().get(request)


class SSOCallbackView(OIDCAuthenticationCallbackView):
    """Back from the provider with a code: the token, the user, the role; any failure back to
    the login page, which says single sign-on failed (the reason goes to the log)."""

    get_settings = staticmethod(oidc_setting)

    def get(self, request: HttpRequest) -> HttpResponse:
        if not sso_enabled():
            raise Http404("single sign-on is not configured")
        try:
            return super().get(request)
        except ProviderUnavailable as exc:
            return _unavailable(exc)
        except (requests.RequestException, SuspiciousOperation) as exc:
            log.warning("single sign-on refused: %s", exc)
            return self.login_failure()


sso_login = SSOLoginView.as_view()
sso_callback = SSOCallbackView.as_view()
