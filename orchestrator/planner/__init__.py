"""Planner: pure functions that prove a profile fits before anything is touched.

Owns the capacity arithmetic of ``dsv4ctl plan`` (no network, no clock, no torch). Today it
holds :mod:`orchestrator.planner.kvpool`, the SGLang 0.5.23 DeepSeek-V4 KV-pool sizing model;
the lead extends this package with the rest of ``plan()``.
"""
