"""Axon's concrete actors: providers, engine, turn runner, tool executor, stream
controller, persister (and stores), log tap."""
