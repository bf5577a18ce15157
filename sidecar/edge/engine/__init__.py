"""The engine client: a pooled HTTP/1.1 client for the one engine, and its errors."""
