"""Tests of evenflow on Ray Train; their Ray cluster is one for the package (conftest.py)."""
