"""Triton entry point: the logic lives in python_backend (queue, planner, engines)."""

from python_backend.triton_model import TritonPythonModel

__all__ = ["TritonPythonModel"]
