"""The entry points of split-layout repositories built before the one model class: their
model.py files import ``FrontModel`` and ``OwnerModel`` from here. Both are the one class, which
reads its role from the config; a rebuilt repository (``make build``) imports it directly."""

from python_backend.triton_model import TritonPythonModel

FrontModel = OwnerModel = TritonPythonModel

__all__ = ["FrontModel", "OwnerModel"]
