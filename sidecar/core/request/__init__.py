"""One request as the sidecar reads it: its body, its claims and objectives, its id, its token
budget check, the timing of its stream (pure)."""
