"""Benchmarks (``python -m odin_ns.bench.<name> --out FILE.json``) and the plan replay simulator."""
