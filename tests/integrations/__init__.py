"""Tests of dblock.contrib: each integration with its real framework."""
