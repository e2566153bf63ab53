"""Axon's benchmarks (issue #6): ``python3 -m benchmarks``; see README.md here."""
