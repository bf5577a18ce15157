"""The demo: a simulated GPU, the emulated engine and the real sidecar, under live load."""
