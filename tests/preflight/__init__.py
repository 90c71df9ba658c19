"""Tests of substrate_gpu.preflight."""
