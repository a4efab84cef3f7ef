"""How a request to an OpenAI-compatible endpoint failed: the transport's own exceptions while it is
retried, and the typed `ProviderError` a request ends with (`typed_error`)."""

from __future__ import annotations

import json

from arenaforge.schemas.errors import ProviderError, ProviderOverloaded, ProviderRefused, ProviderUnreachable

RETRY_STATUS = frozenset({408, 429, 502, 503, 504})
OVERLOAD_STATUS = frozenset({429, 503})


class HTTPStatusError(Exception):
    def __init__(self, status: int, body: bytes, retry_after: str | None) -> None:
        self.status = status
        self.retry_after = retry_after
        try:
            detail = json.loads(body)["error"]["message"]
        except (ValueError, KeyError, TypeError):
            detail = body.decode(errors="replace")
        self.detail = str(detail)
        super().__init__(f"HTTP {status}: {self.detail}")


class ToolsRefused(Exception):
    """The endpoint cannot take native tool calls."""


class Transient(Exception):
    """A timeout, a broken connection or a truncated body: worth another try."""

    def __init__(self, message: str, unreachable: bool = True) -> None:
        super().__init__(message)
        self.unreachable = unreachable  # False: the endpoint answered, but the body was cut


def retry_after(err: Exception) -> float | None:
    value = getattr(err, "retry_after", None)
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def typed_error(err: Exception | None, url: str | None, attempts: int = 1) -> ProviderError:
    """The typed error a failed request ends with."""
    if isinstance(err, HTTPStatusError):
        if err.status in OVERLOAD_STATUS:
            return ProviderOverloaded(f"{url} stayed overloaded after {attempts} attempt(s): {short(err)}")
        if err.status in RETRY_STATUS:
            return ProviderUnreachable(f"{url} failed {attempts} time(s); last: {short(err)}")
        if 400 <= err.status < 500:
            return ProviderRefused(f"{url} refused the request ({short(err)})")
        return ProviderError(f"{url} answered with a server error ({short(err)})")
    if isinstance(err, Transient) and not err.unreachable:
        return ProviderError(f"{url} failed {attempts} time(s); last: {short(err)}")
    return ProviderUnreachable(f"{url} failed {attempts} time(s); last timeout or connection error: {short(err)}")


def short(err: Exception | str | None) -> str:
    return str(err).splitlines()[0][:300] if err else ""
