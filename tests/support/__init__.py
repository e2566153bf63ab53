"""Helpers the tests share: loopback SSE server, fault injection, grammar and parts checks."""
