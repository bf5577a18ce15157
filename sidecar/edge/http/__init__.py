"""The HTTP/1.1 server side: connections, request heads and bodies, answers, and their bounds."""
