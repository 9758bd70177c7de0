from __future__ import annotations

from django.http import HttpRequest, JsonResponse

import dblock
from dblock.contrib.django import fenced_update, lock, locked

from .gate import wait_at
from .models import Stock


def reserve(request: HttpRequest, sku: str) -> JsonResponse:
    """Take one unit of ``sku`` under its lock, the write fenced by the hold's token."""
    lost = False
    try:
        with lock(f"stock:{sku}", ttl=30, timeout=0) as held:
            token = held.token
            assert token is not None
            row, _ = Stock.objects.get_or_create(sku=sku, defaults={"level": 10})
            wait_at(request.GET.get("gate"))
            written = fenced_update(Stock.objects.filter(sku=sku), token, level=row.level - 1)
    except dblock.LockLost:
        lost = True  # the release found the lease gone (force-released while we worked)
    return JsonResponse({"token": token, "written": written, "lost": lost})


@locked("report:{name}", ttl=300, timeout=0)  # outlasts the test on a slow machine
def report(request: HttpRequest, name: str) -> JsonResponse:
    wait_at(request.GET.get("gate"))
    return JsonResponse({"report": name})
