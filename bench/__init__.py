"""Benchmarks (not tests): speed numbers measured on this machine, written down with their command."""
