"""`sluice user add|token|disable|list`: dashboard accounts and API tokens (roles:
dashboard/security/roles.py, tokens: dashboard/security/token_keys.py).  Every change of a role, a token
or an account's state is written to the audit log (via "cli").  `sluice mark-deploy LABEL`:
a deploy marker on the monitoring tab's charts (dashboard/deploys.py), audited too."""
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

from core.cli.base import CommandError, Group, cli_actor, command_group
from dashboard import deploys
from dashboard.security import token_keys as tokens
from dashboard.security.audit_log import Audit
from dashboard.models import AuditOutcome
from dashboard.security.roles import ROLES, forget_role, role_of

PASSWORD_ON_COMMAND_LINE = ("warning: --password puts the password in the process list and the shell history; "
                            "use --password-stdin or the prompt")


def set_role(user: Any, role: str) -> None:
    """Put ``user`` in exactly one Sluice group (the other one removed)."""
    groups = {name: AuthGroup.objects.get_or_create(name=name)[0] for name in ROLES.values()}
    user.groups.remove(*[g for name, g in groups.items() if name != ROLES[role]])
    user.groups.add(groups[ROLES[role]])
    forget_role(user)


def audit(action: str, user: Any, detail: str) -> None:
    """One audit entry for an account change made from the command line."""
    Audit(user=None, action=action, via="cli", target=f"user {user.username}", ids=[str(user.pk)],
          actor=cli_actor()).write(AuditOutcome.OK, detail)


@command_group
class UserCommands(Group):
    def add_to(self, sub) -> None:
        user = sub.add_parser("user", help="dashboard accounts (roles viewer / operator) and API tokens")
        usub = user.add_subparsers(dest="user_action", required=True, metavar="ACTION")
        add = self.handles(usub.add_parser(
            "add", help="create a user with a role (the password is prompted for, or read from stdin)"), self.add)
        add.add_argument("name")
        add.add_argument("--role", choices=sorted(ROLES), required=True,
                         help="viewer: sees everything; operator: also acts (retry, delete, purge…)")
        add.add_argument("--password-stdin", action="store_true",
                         help="read the password from the first line of standard input")
        add.add_argument("--password", help="the password (deprecated: visible to other users of the machine; "
                                            "use --password-stdin or the prompt)")
        add.add_argument("--update", action="store_true",
                         help="when the user exists, set its password and role instead of failing")
        add.add_argument("--json", action="store_true")
        token = self.handles(usub.add_parser(
            "token", help="issue an API token for the user and print it (Authorization: Token <key>); "
                          "tokens are stored hashed, so a key is shown only once"), self.token)
        token.add_argument("name")
        token.add_argument("--reset", action="store_true", help="revoke the user's other tokens first")
        token.add_argument("--revoke", action="store_true", help="revoke every token of the user; issue none")
        token.add_argument("--days", type=int, default=None,
                           help="how long the token lives (default: SLUICE_API_TOKEN_DAYS, 90)")
        token.add_argument("--json", action="store_true")
        disable = self.handles(usub.add_parser(
            "disable", help="disable an account: no login, its sessions and tokens stop working "
                            "(`user add NAME --update` enables it again)"), self.disable)
        disable.add_argument("name")
        disable.add_argument("--json", action="store_true")
        listing = self.handles(usub.add_parser("list", help="users with their Sluice role"), self.list)
        listing.add_argument("--json", action="store_true")

    def _password(self, options: dict[str, Any]) -> str:
        if options["password_stdin"]:
            return sys.stdin.readline().rstrip("\r\n")
        if options["password"] is not None:
            self.stderr.write(PASSWORD_ON_COMMAND_LINE)
            return options["password"]
        if not sys.stdin.isatty():
            raise CommandError("give --password-stdin (and the password on standard input): "
                               "there is no terminal to ask for it on")
        first = getpass.getpass(f"Password for {options['name']}: ")
        if first != getpass.getpass("Password (again): "):
            raise CommandError("the passwords differ; nothing changed")
        return first

    def _user(self, name: str) -> Any:
        user = get_user_model().objects.filter(username=name).first()
        if user is None:
            raise CommandError(f"no user {name!r}; create it with `sluice user add`")
        return user

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
            raise CommandError("password refused: " + "; ".join(exc.messages)) from None
        with transaction.atomic():
            before = role_of(user) if exists else None
            user.set_password(password)
            user.is_active = True
            user.save()
            set_role(user, options["role"])
            audit("set_role", user, f"{'created' if not exists else 'updated'}: role {before or 'none'} → "
                                    f"{options['role']}, password set, active")
        result = {"user": name, "role": options["role"], "created": not exists}
        if options["json"]:
            self.stdout.write(json.dumps(result))
        else:
            self.stdout.write(f"{'updated' if exists else 'created'} user {name} ({options['role']})")

    def token(self, options: dict[str, Any]) -> None:
        user = self._user(options["name"])
        if options["days"] is not None and not 1 <= options["days"] <= 3650:
            raise CommandError("--days must be between 1 and 3650")
        with transaction.atomic():
            revoked = tokens.revoke(user) if options["reset"] or options["revoke"] else 0
            if revoked:
                audit("revoke_token", user, f"{revoked} token(s) revoked")
            if options["revoke"]:
                result: dict[str, Any] = {"user": user.username, "revoked": revoked}
            else:
                token, key = tokens.issue(user, options["days"])
                audit("issue_token", user, f"token {token.prefix}… issued, expires {token.expires:%Y-%m-%d %H:%M} UTC")
                result = {"user": user.username, "token": key, "created": True, "role": role_of(user),
                          "expires": token.expires.isoformat(), "revoked": revoked}
        if options["json"]:
            self.stdout.write(json.dumps(result))
        elif options["revoke"]:
            self.stdout.write(f"revoked {revoked} token(s) of {user.username}")
        else:
            self.stdout.write(result["token"])

    def disable(self, options: dict[str, Any]) -> None:
        user = self._user(options["name"])
        with transaction.atomic():
            user.is_active = False
            user.save(update_fields=["is_active"])
            revoked = tokens.revoke(user)
            audit("disable_user", user, f"disabled; {revoked} token(s) revoked")
        if options["json"]:
            self.stdout.write(json.dumps({"user": user.username, "active": False, "revoked": revoked}))
        else:
            self.stdout.write(f"disabled user {user.username} ({revoked} token(s) revoked)")

    def list(self, options: dict[str, Any]) -> None:
        rows = [{"user": u.username, "role": role_of(u), "active": u.is_active, "superuser": u.is_superuser,
                 "last_login": u.last_login.isoformat() if u.last_login else None,
                 "tokens": tokens.live(u).count()}
                for u in get_user_model().objects.order_by("username")]
        if options["json"]:
            self.stdout.write(json.dumps(rows))
            return
        for r in rows:
            self.stdout.write(f"{r['user']:<24} {r['role'] or '(no role)':<10} "
                              f"{'' if r['active'] else 'inactive'}{' superuser' if r['superuser'] else ''}")


@command_group
class DeployCommands(Group):
    def add_to(self, sub) -> None:
        mark = self.handles(sub.add_parser(
            "mark-deploy", help="mark a deploy (at the database's clock) on every chart of the monitoring tab; "
                                "audited"), self.mark)
        mark.add_argument("label", help="what was deployed, e.g. a version or a commit")
        mark.add_argument("--json", action="store_true")

    def mark(self, options: dict[str, Any]) -> None:
        try:
            marker = deploys.mark_deploy(options["label"], cli_actor())
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        if options["json"]:
            self.stdout.write(json.dumps(deploys.marker_json(marker)))
        else:
            self.stdout.write(f"deploy {marker.label} marked at {marker.at:%Y-%m-%d %H:%M:%S} UTC")
