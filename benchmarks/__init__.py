"""Micro-benchmarks (not tests): ``python -m benchmarks`` runs every ``*_bench.py`` module."""
