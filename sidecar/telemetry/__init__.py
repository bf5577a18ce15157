"""Telemetry: Prometheus collectors and the /capacity document, read from state at scrape time."""
