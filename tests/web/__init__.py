"""Helpers of the web tests: an in-loop server and the Node.js protocol check."""
