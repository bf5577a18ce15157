"""The pure core: capacity math, model specs, the admission state machine and request checks.

Plain synchronous code with no I/O, clock, logging or network library; everything else builds on it.
"""
