"""API token keys: issued, hashed at rest, expiring, revocable (dashboard.security.tokens
authenticates requests with them).  No web framework here: ``sluice user token`` manages
keys from the command line, in processes that serve no request."""
from __future__ import annotations

import datetime as dt
import hashlib
import secrets
from typing import Any

from django.utils import timezone

from core.conf import get_settings
from dashboard.models import ApiToken


def digest_of(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def issue(user: Any, days: int | None = None) -> tuple[ApiToken, str]:
    """A new token for ``user`` valid ``days`` (``SLUICE_API_TOKEN_DAYS``): the row and the
    key, which exists nowhere else once the caller has shown it."""
    key = secrets.token_hex(20)
    lifetime = dt.timedelta(days=days if days is not None else get_settings().API_TOKEN_DAYS)
    token = ApiToken.objects.create(user=user, digest=digest_of(key), prefix=key[:8],
                                    expires=timezone.now() + lifetime)
    return token, key


def revoke(user: Any) -> int:
    """Revoke every live token of ``user``; how many there were."""
    return live(user).update(revoked_at=timezone.now())


def live(user: Any):
    """``user``'s tokens that still authenticate."""
    return ApiToken.objects.filter(user=user, revoked_at__isnull=True, expires__gt=timezone.now())
