"""The edge: the HTTP server side (http), the engine client (engine), the proxy between them
(proxy), the admin port's app (admin), and what both sides share: flow control (flow) and HTTP's
message rules (message)."""
