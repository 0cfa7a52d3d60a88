"""Log in and out: Django's own views, with the dashboard's template."""
from __future__ import annotations

from django.contrib.auth import views as auth_views

login = auth_views.LoginView.as_view(template_name="dashboard/login.html", redirect_authenticated_user=False,
                                     next_page="dashboard:overview")
logout = auth_views.LogoutView.as_view(next_page="dashboard:login")
