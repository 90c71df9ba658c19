"""Helpers shared by test suites: real artefacts (ELF libraries) built on demand."""
