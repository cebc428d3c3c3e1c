"""Import this repository's Salt extension files (``_modules``, ``_utils``, ...) as plain
Python modules, for unit tests that inject Salt's dunders themselves."""

import importlib.util
import pathlib

REPO = pathlib.Path(__file__).resolve().parents[1]


def load_extension(relative_path, module_name):
    """The module in ``REPO / relative_path``, imported under ``module_name``."""
    spec = importlib.util.spec_from_file_location(module_name, REPO / relative_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
