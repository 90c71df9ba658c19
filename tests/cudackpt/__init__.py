"""Tests of substrate_gpu.cudackpt and the cuda-checkpoint stand-in."""
