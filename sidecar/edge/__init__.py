"""The edge: the HTTP server side (http), the engine client (engine), the proxy between them
(proxy), the admin port's app (admin), and the flow control both sides' connections use (flow)."""
