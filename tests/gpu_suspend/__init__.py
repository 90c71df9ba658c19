"""Scenario tests of GPU-aware suspend through the lifecycle (issue 7)."""
