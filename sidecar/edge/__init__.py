"""The edge: the streaming proxy, the engine client, the busy answer, errors, the admin app."""
