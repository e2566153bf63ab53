"""The test suite: pytest-trio, no network; provider tests replay SSE from a loopback server."""
