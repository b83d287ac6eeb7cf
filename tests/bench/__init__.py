"""Benchmarks (`make bench`): pause/resume versus history, throughput, memory. Not tests."""
