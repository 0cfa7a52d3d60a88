"""`sluice user add|token|list`: dashboard accounts and API tokens (roles: dashboard/permissions.py)."""
from __future__ import annotations

import getpass
import json
import sys
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group as AuthGroup
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.db import transaction
from rest_framework.authtoken.models import Token

from core.cli.base import CommandError, Group, command_group
from dashboard.permissions import ROLES, forget_role, role_of


def set_role(user: Any, role: str) -> None:
    """Put ``user`` in exactly one Sluice group (the other one removed)."""
    groups = {name: AuthGroup.objects.get_or_create(name=name)[0] for name in ROLES.values()}
    user.groups.remove(*[g for name, g in groups.items() if name != ROLES[role]])
    user.groups.add(groups[ROLES[role]])
    forget_role(user)


@command_group
class UserCommands(Group):
    def add_to(self, sub) -> None:
        user = sub.add_parser("user", help="dashboard accounts (roles viewer / operator) and API tokens")
        usub = user.add_subparsers(dest="user_action", required=True, metavar="ACTION")
        add = self.handles(usub.add_parser(
            "add", help="create a user with a role (the password is prompted for when not given)"), self.add)
        add.add_argument("name")
        add.add_argument("--role", choices=sorted(ROLES), required=True,
                         help="viewer: sees everything; operator: also acts (retry, delete, purge…)")
        add.add_argument("--password", help="the password (else prompted for on a terminal)")
        add.add_argument("--update", action="store_true",
                         help="when the user exists, set its password and role instead of failing")
        add.add_argument("--json", action="store_true")
        token = self.handles(usub.add_parser(
            "token", help="print the user's API token (Authorization: Token <key>), creating it"), self.token)
        token.add_argument("name")
        token.add_argument("--reset", action="store_true", help="replace the token with a new one")
        token.add_argument("--json", action="store_true")
        listing = self.handles(usub.add_parser("list", help="users with their Sluice role"), self.list)
        listing.add_argument("--json", action="store_true")

    def _password(self, options: dict[str, Any]) -> str:
        if options["password"] is not None:
            return options["password"]
        if not sys.stdin.isatty():
            raise CommandError("give --password: there is no terminal to ask for it on")
        first = getpass.getpass(f"Password for {options['name']}: ")
        if first != getpass.getpass("Password (again): "):
            raise CommandError("the passwords differ; nothing changed")
        return first

    def add(self, options: dict[str, Any]) -> None:
        User = get_user_model()
        name = options["name"].strip()
        if not name or len(name) > 150:
            raise CommandError("a user name is 1–150 characters")
        exists = User.objects.filter(username=name).exists()
        if exists and not options["update"]:
            raise CommandError(f"user {name!r} exists; add --update to set its password and role")
        password = self._password(options)
        if not password:
            raise CommandError("the password must not be empty")
        user = User.objects.filter(username=name).first() or User(username=name)
        try:
            validate_password(password, user)
        except ValidationError as exc:
            raise CommandError("; ".join(exc.messages)) from None
        with transaction.atomic():
            user.set_password(password)
            user.is_active = True
            user.save()
            set_role(user, options["role"])
        result = {"user": name, "role": options["role"], "created": not exists}
        if options["json"]:
            self.stdout.write(json.dumps(result))
        else:
            self.stdout.write(f"{'updated' if exists else 'created'} user {name} ({options['role']})")

    def token(self, options: dict[str, Any]) -> None:
        user = get_user_model().objects.filter(username=options["name"]).first()
        if user is None:
            raise CommandError(f"no user {options['name']!r}; create it with `sluice user add`")
        if options["reset"]:
            Token.objects.filter(user=user).delete()
        token, created = Token.objects.get_or_create(user=user)
        if options["json"]:
            self.stdout.write(json.dumps({"user": user.username, "token": token.key, "created": created,
                                          "role": role_of(user)}))
        else:
            self.stdout.write(token.key)

    def list(self, options: dict[str, Any]) -> None:
        rows = [{"user": u.username, "role": role_of(u), "active": u.is_active, "superuser": u.is_superuser,
                 "last_login": u.last_login.isoformat() if u.last_login else None}
                for u in get_user_model().objects.order_by("username")]
        if options["json"]:
            self.stdout.write(json.dumps(rows))
            return
        for r in rows:
            self.stdout.write(f"{r['user']:<24} {r['role'] or '(no role)':<10} "
                              f"{'' if r['active'] else 'inactive'}{' superuser' if r['superuser'] else ''}")
