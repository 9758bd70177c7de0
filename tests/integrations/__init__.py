"""Tests of dblock inside the frameworks applications use (dblock.contrib)."""
