"""Benchmarks run by `vgc bench <name>`; each prints a table of numbers measured in one run."""
