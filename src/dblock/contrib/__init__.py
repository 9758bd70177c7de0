"""Integrations with frameworks users already run; each is an optional extra, and
``import dblock`` loads none of them."""

from __future__ import annotations
