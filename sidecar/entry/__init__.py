"""Entry points: the CLI and its commands, settings, logging and the composition root."""
