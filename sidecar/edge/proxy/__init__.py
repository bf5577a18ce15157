"""The proxy port between them: routes, intake, admission, the relay and the busy answer."""
