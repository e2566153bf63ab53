"""Axon: a Trio actor runtime that streams multi-step, tool-calling LLM agent turns."""
