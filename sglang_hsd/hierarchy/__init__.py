"""Hierarchy planner: expected-latency model, exact optimiser, acceptance and cost measurement."""
