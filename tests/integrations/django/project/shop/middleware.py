from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse

import dblock


def busy_is_409(get_response: Callable[[HttpRequest], HttpResponse]) -> Callable[..., object]:
    """A busy lock answers 409 Conflict, as a project would do it."""

    def middleware(request: HttpRequest) -> HttpResponse:
        return get_response(request)

    def process_exception(request: HttpRequest, exc: Exception) -> HttpResponse | None:
        if isinstance(exc, (dblock.LockTimeout, dblock.InProgress)):
            return HttpResponse(str(exc), status=409)
        return None

    middleware.process_exception = process_exception  # type: ignore[attr-defined]
    return middleware
