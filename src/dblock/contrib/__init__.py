"""Integrations with the frameworks applications already use (each an optional extra)."""
