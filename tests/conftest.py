"""Shared fixtures: real servers on loopback sockets live in tests/servers.py."""

pytest_plugins = ["tests.servers"]
