"""Runs too long for make test: each has its own make target (the Makefile says which)."""
