"""The cuda-checkpoint tests' fixtures (the runsc stand-in's driver, a GPU bundle with the
cuda-checkpoint stand-in inside), for gpu-suspend.md's examples."""

from cudackpt.conftest import make_gpu_bundle, runsc_root, runtime

__all__ = ["make_gpu_bundle", "runsc_root", "runtime"]
