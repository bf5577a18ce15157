"""The control laws that move the admission limit: evidence in, a limit out (pure)."""
